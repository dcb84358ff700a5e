"""Token-level cross-entropy (fairseq's `cross_entropy` criterion), and the fast loss path both criteria share.

Speed: the output projection to the vocabulary is the largest matrix product of a BART step, and most target
positions of a padded batch are padding. So the criterion asks the model for hidden states
(`model(**net_input, features_only=True)`), keeps only the rows whose target is not padding, and projects those
(`model.output_layer`). The loss itself is a custom autograd function working from logsumexp: no log-softmax
tensor is kept, and the backward pass builds the gradient (softmax - smoothing - one-hot) in a single
vocabulary-sized buffer. Models without `output_layer` fall back to full logits from `model(**net_input)`.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from seqtrain.registry import CRITERIONS


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Flags of the criteria (fairseq names); flags already on the parser are skipped."""
    group = parser.add_argument_group("criterion")
    existing = parser._option_string_actions
    specs = [
        (("--criterion",), dict(default="cross_entropy", choices=["cross_entropy", "label_smoothed_cross_entropy"],
                                help="training criterion")),
        (("--label-smoothing",), dict(type=float, default=0.0, metavar="D",
                                      help="epsilon for label smoothing, 0 means no label smoothing")),
        (("--report-accuracy",), dict(action="store_true", help="report token accuracy")),
        (("--ignore-prefix-size",), dict(type=int, default=0, help="ignore the first N target tokens")),
        (("--sentence-avg",), dict(action="store_true",
                                   help="normalize gradients by the number of sentences, not tokens")),
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
    def forward(ctx: Any, logits: Tensor, target: Tensor, epsilon: float) -> Tuple[Tensor, Tensor]:
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
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Optional[Tensor]) -> Tuple[Optional[Tensor], None, None]:
        logits, target, lse = ctx.saved_tensors
        x = logits if logits.dtype == torch.float64 else logits.float()
        grad = torch.exp(x - lse.unsqueeze(-1))
        if ctx.eps_i:
            grad.sub_(ctx.eps_i)
        grad.scatter_add_(-1, target.unsqueeze(-1), grad.new_full((grad.size(0), 1), -ctx.c_target))
        grad.mul_(grad_loss.unsqueeze(-1).to(grad.dtype))
        return grad.to(logits.dtype), None, None


def smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float = 0.0) -> Tuple[Tensor, Tensor]:
    """Per-row (loss, nll) for N x V logits and N targets; see _SmoothedNLL. Computed in fp32 (fp64 kept)."""
    return _SmoothedNLL.apply(logits, target, float(epsilon))


def _output_layer(model: Any):
    if hasattr(model, "output_layer"):
        return model.output_layer
    inner = getattr(model, "module", None)  # DistributedDataParallel and similar wrappers
    return getattr(inner, "output_layer", None)


def target_logits(model: Any, sample: Dict[str, Any], padding_idx: int,
                  ignore_prefix_size: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """Logits for the non-pad target positions only: (logits N x V, targets N, mask B x T')."""
    target = sample["target"]
    project = _output_layer(model)
    if project is not None:
        hidden = model(**sample["net_input"], features_only=True)[0]
    else:
        hidden = model(**sample["net_input"])[0]
    if ignore_prefix_size > 0:
        hidden = hidden[:, ignore_prefix_size:]
        target = target[:, ignore_prefix_size:]
    mask = target.ne(padding_idx)
    selected = hidden[mask]
    logits = project(selected) if project is not None else selected
    return logits, target[mask], mask


def _scatter_back(values: Tensor, mask: Tensor) -> Tensor:
    """Per-token values (N) placed into a flat B*T tensor with zeros at pads (fairseq's reduce=False shape)."""
    out = values.new_zeros(mask.shape)
    out[mask] = values
    return out.view(-1)


def get_perplexity(loss_base2: Optional[float], digits: int = 2) -> float:
    """2 ** loss rounded as fairseq logs it; inf on overflow."""
    if loss_base2 is None:
        return math.inf
    try:
        return round(2 ** loss_base2, digits)
    except OverflowError:
        return math.inf


def _sum(logs: List[Dict[str, Any]], key: str) -> float:
    return float(sum(float(log.get(key, 0)) for log in logs))


@CRITERIONS.register("cross_entropy")
class CrossEntropyCriterion:
    """Summed token NLL (natural log) over non-pad targets; sample_size = ntokens (nsentences with
    --sentence-avg)."""

    def __init__(self, padding_idx: int, sentence_avg: bool = False, report_accuracy: bool = False,
                 ignore_prefix_size: int = 0, label_smoothing: float = 0.0):
        self.padding_idx = padding_idx
        self.sentence_avg = sentence_avg
        self.report_accuracy = report_accuracy
        self.ignore_prefix_size = ignore_prefix_size
        self.eps = label_smoothing

    @classmethod
    def from_args(cls, args: Any, padding_idx: int) -> "CrossEntropyCriterion":
        return cls(padding_idx, sentence_avg=bool(getattr(args, "sentence_avg", False)),
                   report_accuracy=bool(getattr(args, "report_accuracy", False)),
                   ignore_prefix_size=int(getattr(args, "ignore_prefix_size", 0) or 0))

    def __call__(self, model: Any, sample: Dict[str, Any], reduce: bool = True) -> Tuple[Tensor, Any, Dict[str, Any]]:
        return self.forward(model, sample, reduce)

    def forward(self, model: Any, sample: Dict[str, Any], reduce: bool = True) -> Tuple[Tensor, Any, Dict[str, Any]]:
        logits, target, mask = target_logits(model, sample, self.padding_idx, self.ignore_prefix_size)
        loss, nll = smoothed_nll_loss(logits, target, self.eps)
        if reduce:
            loss, nll = loss.sum(), nll.sum()
        else:
            loss, nll = _scatter_back(loss, mask), _scatter_back(nll, mask)
        nsentences = sample["target"].size(0)
        ntokens = sample.get("ntokens", int(mask.sum()))
        sample_size = nsentences if self.sentence_avg else ntokens
        # detached tensors, not floats: .item() here would force a device sync every step
        logging_output: Dict[str, Any] = {
            "loss": loss.detach(),
            "nll_loss": nll.detach(),
            "ntokens": ntokens,
            "nsentences": nsentences,
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            with torch.no_grad():
                logging_output["n_correct"] = logits.argmax(-1).eq(target).sum()
                logging_output["total"] = target.numel()
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[Dict[str, Any]]) -> Dict[str, float]:
        """Aggregate logging outputs as fairseq logs them: loss per sample_size and nll_loss per token, both in
        base 2; ppl = 2 ** nll_loss; accuracy in percent with --report-accuracy. (When averaging over several
        steps, weight loss by sample_size and nll_loss by ntokens, and recompute ppl from the averaged nll_loss.)"""
        loss_sum = _sum(logging_outputs, "loss")
        nll_sum = _sum(logging_outputs, "nll_loss")
        ntokens = _sum(logging_outputs, "ntokens")
        sample_size = _sum(logging_outputs, "sample_size")
        out: Dict[str, float] = {
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

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
