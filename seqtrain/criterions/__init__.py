"""Training criteria with fairseq's names: cross_entropy, label_smoothed_cross_entropy.

`criterion(model, sample, reduce=True) -> (loss, sample_size, logging_output)`;
`Criterion.reduce_metrics(logging_outputs) -> dict` gives the numbers fairseq logs (base 2, ppl, accuracy).
"""

from __future__ import annotations

from typing import Any

from seqtrain.criterions.cross_entropy import (
    CrossEntropyCriterion,
    add_args,
    get_perplexity,
    smoothed_nll_loss,
)
from seqtrain.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS


def build_criterion(args: Any, task_or_padding_idx: Any) -> CrossEntropyCriterion:
    """Build `args.criterion`; the second argument is a task (its target dictionary gives the pad index), a
    Dictionary, or the pad index itself."""
    if isinstance(task_or_padding_idx, int):
        pad = task_or_padding_idx
    else:
        obj = task_or_padding_idx
        for attr in ("target_dictionary", "tgt_dict"):
            if getattr(obj, attr, None) is not None:
                obj = getattr(obj, attr)
                break
        pad = obj.pad()
    name = getattr(args, "criterion", None) or "cross_entropy"
    if name not in CRITERIONS:
        raise SeqtrainError(
            f"--criterion: unknown criterion {name!r}; choose from: {', '.join(CRITERIONS.names())}"
        )
    return CRITERIONS.get(name).from_args(args, pad)


__all__ = [
    "CrossEntropyCriterion",
    "LabelSmoothedCrossEntropyCriterion",
    "add_args",
    "build_criterion",
    "get_perplexity",
    "smoothed_nll_loss",
]
