"""Token-level cross-entropy (fairseq's `cross_entropy` criterion), and the fast loss path both criteria share.

Speed: the output projection to the vocabulary is the largest matrix product of a BART step, and most target
positions of a padded batch are padding. So the criterion asks the model for hidden states
(`model(**net_input, features_only=True)`), keeps only the rows whose target is not padding, and projects those
(`model.output_layer`). For BART (a bias-free output projection) projection and loss run together over chunks of
rows (_ProjectedSmoothedNLL): each chunk's logits, loss and gradient are computed and folded into the gradients
of the hidden states and the projection at once, so no N x V tensor is kept for the backward pass. Otherwise
(reduce=False, other output layers) the logits are made whole and the loss is a custom autograd function working
from logsumexp that builds the gradient (softmax - smoothing - one-hot) in a single vocabulary-sized buffer.
Models without `output_layer` fall back to full logits from `model(**net_input)`.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch import Tensor

from seqtrain.registry import CRITERIONS


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Flags of the criteria (fairseq names); flags already on the parser are skipped."""
    group = parser.add_argument_group("criterion")
    existing = parser._option_string_actions
    specs = [
        (
            ("--criterion",),
            dict(
                default="cross_entropy",
                choices=CRITERIONS.names(),  # a --user-dir plugin's are registered by now
                help="training criterion",
            ),
        ),
        (
            ("--label-smoothing",),
            dict(
                type=float,
                default=0.0,
                metavar="D",
                help="epsilon for label smoothing, 0 means no label smoothing",
            ),
        ),
        (("--report-accuracy",), dict(action="store_true", help="report token accuracy")),
        (("--ignore-prefix-size",), dict(type=int, default=0, help="ignore the first N target tokens")),
        (
            ("--sentence-avg",),
            dict(action="store_true", help="normalize gradients by the number of sentences, not tokens"),
        ),
    ]
    for flags, kw in specs:
        if not any(f in existing for f in flags):
            group.add_argument(*flags, **kw)
    return group


class _SmoothedNLL(torch.autograd.Function):
    """Per-token (label-smoothed) NLL from raw logits, fairseq's formula:
        loss = (1 - eps - eps_i) * nll + eps_i * smooth,   eps_i = eps / (V - 1),
        nll = lse - x[t],   smooth = -sum_v log p_v = V * lse - sum_v x_v.
    Because (1 - eps - eps_i) + eps_i * V = 1, d loss / d x = softmax(x) - eps_i - (1 - eps - eps_i) * onehot(t).
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


class _ProjectedSmoothedNLL(torch.autograd.Function):
    """Output projection and _SmoothedNLL's loss in one, over row chunks, summed: the N x V logits never exist
    whole. For each chunk of hidden rows h (n x C) the forward pass computes the logits h W^T, the loss, and the
    gradient of the loss with respect to those logits, which it folds straight into the gradients with respect
    to h (n x C) and W (V x C, accumulated). The backward pass only scales the stored gradients by the incoming
    one. Peak memory for the loss: one chunk of logits instead of three N x V tensors (logits, their gradient,
    the output layer's input gradient work), which for summarization batches (thousands of target tokens, a
    vocabulary of 8k-50k) is a large share of a training step's memory.

    Matrix products run under whatever autocast is active (as the model's own F.linear would), the softmax and
    the loss in fp32. Returns (loss sum, nll sum, number of correct argmax predictions; 0 unless `accuracy`)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        epsilon: float,
        chunk: int,
        need_grad: bool,
        accuracy: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, vocab = hidden.size(0), weight.size(0)
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        c_target = 1.0 - epsilon - eps_i
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        nll_sum = torch.zeros((), dtype=acc, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_grad else None
        grad_w = torch.zeros_like(weight) if need_grad else None
        for start in range(0, n, chunk):
            h, t = hidden[start : start + chunk], target[start : start + chunk]
            z = torch.nn.functional.linear(h, weight)
            x = z if z.dtype == torch.float64 else z.float()
            lse = torch.logsumexp(x, dim=-1)
            nll = lse - x.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            nll_sum += nll.sum()
            if epsilon > 0:
                loss += c_target * nll.sum() + eps_i * (vocab * lse - x.sum(dim=-1)).sum()
            else:
                loss += nll.sum()
            if accuracy:
                correct += x.argmax(-1).eq(t).sum()
            if need_grad:
                g = x.sub_(lse.unsqueeze(-1)).exp_()  # softmax, in place of the logits
                if eps_i:
                    g.sub_(eps_i)
                g.scatter_add_(-1, t.unsqueeze(-1), g.new_full((g.size(0), 1), -c_target))
                g = g.to(z.dtype)
                grad_h[start : start + chunk] = torch.matmul(g, weight)
                grad_w += torch.matmul(g.t(), h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.mark_non_differentiable(nll_sum, correct)
        return loss, nll_sum, correct

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _g1: Any, _g2: Any) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is None:
            raise RuntimeError(
                "backward through a projected loss computed without gradients (need_grad=False)"
            )
        return (
            grad_h * grad_loss.to(grad_h.dtype),
            grad_w * grad_loss.to(grad_w.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def projected_nll_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float = 0.0,
    chunk_elements: int = 1 << 22,
    accuracy: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed (loss, nll, n_correct) of the rows `hidden` (N x C) projected by `weight` (V x C, no bias);
    n_correct (the argmax pass over the logits) only with `accuracy`, else 0;
    equal to smoothed_nll_loss(hidden @ weight.T, target, epsilon) summed, computed chunk by chunk
    (about `chunk_elements` logits at a time). See _ProjectedSmoothedNLL."""
    chunk = max(1, chunk_elements // max(1, weight.size(0)))
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ProjectedSmoothedNLL.apply(hidden, weight, target, float(epsilon), chunk, need_grad, accuracy)


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


def _target_hidden(
    model: Any, sample: dict[str, Any], padding_idx: int, ignore_prefix_size: int, features_only: bool
) -> tuple[Tensor, Tensor, Tensor]:
    target = sample["target"]
    hidden = (
        model(**sample["net_input"], features_only=True)[0]
        if features_only
        else model(**sample["net_input"])[0]
    )
    if ignore_prefix_size > 0:
        hidden = hidden[:, ignore_prefix_size:]
        target = target[:, ignore_prefix_size:]
    mask = target.ne(padding_idx)
    return hidden[mask], target[mask], mask


def target_logits(
    model: Any, sample: dict[str, Any], padding_idx: int, ignore_prefix_size: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Logits for the non-pad target positions only: (logits N x V, targets N, mask B x T')."""
    project = _output_layer(model)
    selected, target, mask = _target_hidden(
        model, sample, padding_idx, ignore_prefix_size, project is not None
    )
    logits = project(selected) if project is not None else selected
    return logits, target, mask


def _scatter_back(values: Tensor, mask: Tensor) -> Tensor:
    """Per-token values (N) placed into a flat B*T tensor with zeros at pads (fairseq's reduce=False shape)."""
    out = values.new_zeros(mask.shape)
    out[mask] = values
    return out.view(-1)


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


@CRITERIONS.register("cross_entropy")
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
    ):
        self.padding_idx = padding_idx
        self.sentence_avg = sentence_avg
        self.report_accuracy = report_accuracy
        self.ignore_prefix_size = ignore_prefix_size
        self.eps = label_smoothing

    @classmethod
    def from_args(cls, args: Any, padding_idx: int) -> CrossEntropyCriterion:
        return cls(
            padding_idx,
            sentence_avg=bool(getattr(args, "sentence_avg", False)),
            report_accuracy=bool(getattr(args, "report_accuracy", False)),
            ignore_prefix_size=int(getattr(args, "ignore_prefix_size", 0) or 0),
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
            # the usual path: projection and loss chunk by chunk, no N x V tensor kept. The weight is read after
            # the forward pass: FSDP swaps sharded parameters for gathered ones during it.
            hidden, target, mask = _target_hidden(
                model, sample, self.padding_idx, self.ignore_prefix_size, True
            )
            loss, nll, n_correct = projected_nll_loss(
                hidden, _output_weight(model), target, self.eps, accuracy=self.report_accuracy
            )
        else:
            logits, target, mask = target_logits(model, sample, self.padding_idx, self.ignore_prefix_size)
            loss, nll = smoothed_nll_loss(logits, target, self.eps)
            if reduce:
                loss, nll = loss.sum(), nll.sum()
            else:
                loss, nll = _scatter_back(loss, mask), _scatter_back(nll, mask)
            if self.report_accuracy:
                with torch.no_grad():
                    n_correct = logits.argmax(-1).eq(target).sum()
        nsentences = sample["target"].size(0)
        ntokens = sample.get("ntokens", int(mask.sum()))
        sample_size = nsentences if self.sentence_avg else ntokens
        # detached tensors, not floats: .item() here would force a device sync every step
        logging_output: dict[str, Any] = {
            "loss": loss.detach(),
            "nll_loss": nll.detach(),
            "ntokens": ntokens,
            "nsentences": nsentences,
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            logging_output["n_correct"] = n_correct
            logging_output["total"] = target.numel()
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
