"""Token-level cross-entropy (fairseq's `cross_entropy` criterion), and the fast loss path both criteria share.

Speed: the output projection to the vocabulary is the largest matrix product of a BART step, and most target
positions of a padded batch are padding. So the criterion asks the model for hidden states
(`model(**net_input, features_only=True)`) and scores only the rows whose target is not padding: a model that
ran packed (the collater's layout) returns just those rows; else the rows listed in `sample["target_rows"]`
when the collater gives them, else every row with the pads weighted 0 (selecting them by a boolean mask would
force a host-device sync on CUDA). For BART (a bias-free output projection) projection and loss run together
over chunks of rows (projected_loss.py): each chunk's logits, loss and gradient are computed and folded into
the gradients of the hidden states and the projection at once, so no N x V tensor is kept for the backward
pass. Otherwise (reduce=False, other output layers) the logits are made whole and the loss is a custom
autograd function working from logsumexp that builds the gradient (softmax - smoothing - one-hot) in a single
vocabulary-sized buffer; with reduce=False on a packed batch the losses are per real target token (N), not
per position. Models without `output_layer` fall back to
full logits from `model(**net_input)`. Nothing here forces a host-device sync.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from seqtrain.config import setting, settings
from seqtrain.criterions.projected_loss import projected_nll_loss
from seqtrain.flag_bounds import PROBABILITY, Bounds
from seqtrain.registry import CRITERIONS


@settings
class CriterionConfig:
    """criterion: the settings every criterion reads (fairseq's names); a criterion registers its settings
    class with it (`CRITERIONS.register(name, config=...)`) and builds from it (`from_config`)"""

    criterion: str = setting(
        "cross_entropy", "training criterion", choices=CRITERIONS.names
    )  # a --user-dir plugin's are registered by the time the parser is built
    label_smoothing: float = setting(
        0.0,
        "epsilon for label smoothing, 0 means no label smoothing",
        type=float,
        metavar="D",
        bounds=PROBABILITY,
    )
    report_accuracy: bool = setting(False, "report token accuracy", action="store_true")
    ignore_prefix_size: int = setting(0, "ignore the first N target tokens", type=int)
    sentence_avg: bool = setting(
        False, "normalize gradients by the number of sentences, not tokens", action="store_true"
    )
    loss_chunk_mb: float | None = setting(
        None,
        "memory for the loss's logits, per chunk of target rows (default: 256 on a CPU, 1024 on "
        "CUDA); the chunking follows from the shapes and this budget only, so a resumed run sums as the "
        "unbroken one",
        type=float,
        metavar="MB",
        bounds=Bounds(0, 1 << 20, lo_open=True),
    )


CRITERIONS.common = (
    CriterionConfig  # what a --user-dir criterion registered without settings of its own reads
)


class _SmoothedNLL(torch.autograd.Function):
    """Per-token (label-smoothed) NLL from raw logits, fairseq's formula:
        loss = (1 - eps - eps_i) * nll + eps_i * smooth,   eps_i = eps / (V - 1),
        nll = lse - x[t],   smooth = -sum_v log p_v = V * lse - sum_v x_v.
    Because (1 - eps - eps_i) + eps_i * V = 1,
        d loss / d x = softmax(x) - eps_i - (1 - eps - eps_i) * onehot(t).
    Returns (loss, nll) per row; nll carries no gradient (it is only logged)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        x = logits if logits.dtype == torch.float64 else logits.float()
        vocab = x.size(-1)
        lse = torch.logsumexp(x, dim=-1)
        nll = lse - x.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        if epsilon > 0:
            eps_i = epsilon / (vocab - 1)
            smooth = vocab * lse - x.sum(dim=-1)
            loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        else:
            eps_i, loss = 0.0, nll.clone()
        ctx.save_for_backward(logits, target, lse)
        ctx.eps_i = eps_i
        ctx.c_target = 1.0 - epsilon - eps_i
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor | None) -> tuple[Tensor | None, None, None]:
        logits, target, lse = ctx.saved_tensors
        x = logits if logits.dtype == torch.float64 else logits.float()
        grad = torch.exp(x - lse.unsqueeze(-1))
        if ctx.eps_i:
            grad.sub_(ctx.eps_i)
        grad.scatter_add_(-1, target.unsqueeze(-1), grad.new_full((grad.size(0), 1), -ctx.c_target))
        grad.mul_(grad_loss.unsqueeze(-1).to(grad.dtype))
        return grad.to(logits.dtype), None, None


def smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float = 0.0) -> tuple[Tensor, Tensor]:
    """Per-row (loss, nll) for N x V logits and N targets; see _SmoothedNLL. Computed in fp32 (fp64 kept)."""
    return _SmoothedNLL.apply(logits, target, float(epsilon))


def _output_layer(model: Any):
    if hasattr(model, "output_layer"):
        return model.output_layer
    inner = getattr(model, "module", None)  # DistributedDataParallel and similar wrappers
    return getattr(inner, "output_layer", None)


def _output_weight(model: Any) -> Tensor | None:
    """The output projection's weight when the model's output layer is a plain bias-free linear map (BART's,
    tied to the embeddings), so the loss can project chunk by chunk; None otherwise."""
    inner = getattr(model, "module", model)  # DistributedDataParallel and similar wrappers
    proj = getattr(getattr(inner, "decoder", None), "output_projection", None)
    if isinstance(proj, torch.nn.Linear) and proj.bias is None and hasattr(inner, "output_layer"):
        return proj.weight
    return None


def _target_rows(
    model: Any,
    sample: dict[str, Any],
    padding_idx: int,
    ignore_prefix_size: int,
    features_only: bool,
    use_rows: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The rows the loss scores, without a host-device sync: (rows N x C, targets N, valid N or None).

    A model that ran packed (the collater's layout; extra["packed"]) returns exactly the rows of the real
    target positions, in the order of `sample["target_rows"]`, so they are the rows, and the targets are
    gathered by those indices (with --ignore-prefix-size, `valid` marks the rows past the prefix). Otherwise,
    with `use_rows` and `sample["target_rows"]` (the collater's flat indices of the non-pad positions of
    `sample["target"]`) only those rows are gathered and `valid` is None. Without it (or with
    --ignore-prefix-size) every position is kept and `valid` marks the non-pad ones: a boolean-mask selection
    would wait for the device to count them.
    """
    target = sample["target"]
    net_input = sample["net_input"]
    out, extra = model(**net_input, features_only=True) if features_only else model(**net_input)
    rows = sample.get("target_rows")
    if isinstance(extra, dict) and extra.get("packed"):
        assert rows is not None, "a packed batch needs the collater's target_rows"
        picked = target.reshape(-1).index_select(0, rows)
        if ignore_prefix_size == 0:
            return out, picked, None
        # position ids count from padding_idx + 1 (make_positions): index in the sequence = id - pad - 1
        index = net_input["layout"]["tgt_positions"] - (padding_idx + 1)
        return out, picked, index.ge(ignore_prefix_size)
    rows = rows if use_rows and ignore_prefix_size == 0 else None
    if ignore_prefix_size > 0:
        out = out[:, ignore_prefix_size:]
        target = target[:, ignore_prefix_size:]
    flat, flat_target = out.reshape(-1, out.size(-1)), target.reshape(-1)
    if rows is not None:
        return flat.index_select(0, rows), flat_target.index_select(0, rows), None
    return flat, flat_target, flat_target.ne(padding_idx)


def _zero_invalid(values: Tensor, valid: Tensor | None) -> Tensor:
    return values if valid is None else values * valid


def get_perplexity(loss_base2: float | None, digits: int = 2) -> float:
    """2 ** loss rounded as fairseq logs it; inf on overflow."""
    if loss_base2 is None:
        return math.inf
    try:
        return round(2**loss_base2, digits)
    except OverflowError:
        return math.inf


def _sum(logs: list[dict[str, Any]], key: str) -> float:
    return float(sum(float(log.get(key, 0)) for log in logs))


def count_correct(logits: Tensor, target: Tensor, valid: Tensor | None) -> Tensor:
    """--report-accuracy's count: argmax hits over the scored (non-pad) rows, on the device."""
    with torch.no_grad():
        hits = logits.argmax(-1).eq(target)
        return (hits if valid is None else hits & valid).sum()


def step_logging_output(
    sample: dict[str, Any],
    target: Tensor,
    valid: Tensor | None,
    sentence_avg: bool,
    losses: dict[str, Tensor],
    n_correct: Tensor | None = None,
) -> tuple[Any, dict[str, Any]]:
    """(sample_size, logging_output) of one step, as every criterion here reports it: `losses` (name -> summed
    tensor, in log order) detached, then the counts; n_correct and total with --report-accuracy."""
    nsentences = sample["target"].size(0)
    # the collater's count (a host int); else counted on the device, no sync
    scored = target.numel() if valid is None else valid.sum()
    ntokens = sample.get("ntokens", scored)
    sample_size = nsentences if sentence_avg else ntokens
    # detached tensors, not floats: .item() here would force a device sync every step
    logging_output: dict[str, Any] = {name: value.detach() for name, value in losses.items()}
    logging_output.update(ntokens=ntokens, nsentences=nsentences, sample_size=sample_size)
    if n_correct is not None:
        logging_output["n_correct"] = n_correct
        logging_output["total"] = scored
    return sample_size, logging_output


@CRITERIONS.register("cross_entropy", config=CriterionConfig)
class CrossEntropyCriterion:
    """Summed token NLL (natural log) over non-pad targets; sample_size = ntokens (nsentences with
    --sentence-avg)."""

    def __init__(
        self,
        padding_idx: int,
        sentence_avg: bool = False,
        report_accuracy: bool = False,
        ignore_prefix_size: int = 0,
        label_smoothing: float = 0.0,
        loss_chunk_mb: float | None = None,
    ):
        self.padding_idx = padding_idx
        self.sentence_avg = sentence_avg
        self.report_accuracy = report_accuracy
        self.ignore_prefix_size = ignore_prefix_size
        self.eps = label_smoothing
        self.loss_chunk_mb = loss_chunk_mb  # the projected loss's chunk budget (None: the device's default)
        # The factor the trainer multiplies the loss by before backward (the fp16 loss scale; 1 otherwise):
        # the projected loss makes its gradients in the forward pass and applies it before their fp16 casts.
        self.loss_scale = 1.0

    needs_task = False  # from_config takes the padding index (True: the task)

    @classmethod
    def from_config(cls, cfg: CriterionConfig, padding_idx: int) -> CrossEntropyCriterion:
        return cls(
            padding_idx,
            sentence_avg=cfg.sentence_avg,
            report_accuracy=cfg.report_accuracy,
            ignore_prefix_size=cfg.ignore_prefix_size,
            loss_chunk_mb=cfg.loss_chunk_mb,
        )

    def __call__(
        self, model: Any, sample: dict[str, Any], reduce: bool = True
    ) -> tuple[Tensor, Any, dict[str, Any]]:
        return self.forward(model, sample, reduce)

    def forward(
        self, model: Any, sample: dict[str, Any], reduce: bool = True
    ) -> tuple[Tensor, Any, dict[str, Any]]:
        n_correct = None
        if reduce and _output_weight(model) is not None:
            # the usual path: projection and loss chunk by chunk, no N x V tensor kept. The weight is read
            # after the forward pass: FSDP swaps sharded parameters for gathered ones during it.
            hidden, target, valid = _target_rows(
                model, sample, self.padding_idx, self.ignore_prefix_size, True
            )
            loss, nll, n_correct = projected_nll_loss(
                hidden,
                _output_weight(model),
                target,
                self.eps,
                valid=valid,
                accuracy=self.report_accuracy,
                grad_scale=self.loss_scale,
                budget_mb=self.loss_chunk_mb,
            )
        else:
            project = _output_layer(model)
            selected, target, valid = _target_rows(
                model, sample, self.padding_idx, self.ignore_prefix_size, project is not None, use_rows=reduce
            )
            logits = project(selected) if project is not None else selected
            loss, nll = smoothed_nll_loss(logits, target, self.eps)
            loss, nll = _zero_invalid(loss, valid), _zero_invalid(nll, valid)
            if reduce:
                loss, nll = loss.sum(), nll.sum()
            if self.report_accuracy:
                n_correct = count_correct(logits, target, valid)
        sample_size, logging_output = step_logging_output(
            sample,
            target,
            valid,
            self.sentence_avg,
            {"loss": loss, "nll_loss": nll},
            n_correct if self.report_accuracy else None,
        )
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: list[dict[str, Any]]) -> dict[str, float]:
        """Aggregate logging outputs as fairseq logs them: loss per sample_size and nll_loss per token, both in
        base 2; ppl = 2 ** nll_loss; accuracy in percent with --report-accuracy. (When averaging over several
        steps, weight loss by sample_size and nll_loss by ntokens, and recompute ppl from the averaged nll_loss.)"""
        loss_sum = _sum(logging_outputs, "loss")
        nll_sum = _sum(logging_outputs, "nll_loss")
        ntokens = _sum(logging_outputs, "ntokens")
        sample_size = _sum(logging_outputs, "sample_size")
        out: dict[str, float] = {
            "loss": loss_sum / sample_size / math.log(2) if sample_size else 0.0,
            "nll_loss": nll_sum / ntokens / math.log(2) if ntokens else 0.0,
            "ntokens": ntokens,
            "nsentences": _sum(logging_outputs, "nsentences"),
            "sample_size": sample_size,
        }
        out["ppl"] = get_perplexity(out["nll_loss"])
        total = _sum(logging_outputs, "total")
        if total > 0:
            out["n_correct"] = _sum(logging_outputs, "n_correct")
            out["total"] = total
            out["accuracy"] = round(out["n_correct"] * 100.0 / total, 3)
        return out
