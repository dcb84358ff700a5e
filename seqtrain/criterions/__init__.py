"""Training criteria with fairseq's names: cross_entropy, label_smoothed_cross_entropy, and
label_smoothed_cross_entropy_with_distillation (word-level KD from a --teacher-path, distillation.py).

`criterion(model, sample, reduce=True) -> (loss, sample_size, logging_output)`;
`Criterion.reduce_metrics(logging_outputs) -> dict` gives the numbers fairseq logs (base 2, ppl, accuracy).
"""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.criterions import distillation
from seqtrain.criterions.cross_entropy import (
    CrossEntropyCriterion,
    get_perplexity,
    smoothed_nll_loss,
)
from seqtrain.criterions.cross_entropy import add_args as _add_common_args
from seqtrain.criterions.distillation import LabelSmoothedCrossEntropyWithDistillationCriterion
from seqtrain.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Flags of the criteria (fairseq names, then distillation's); flags already on the parser are skipped."""
    group = _add_common_args(parser)
    distillation.add_args(parser, group)
    return group


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
    if getattr(args, "teacher_path", None) and name != distillation.NAME:
        raise SeqtrainError(f"--teacher-path is read only by --criterion {distillation.NAME}, not {name}")
    cls = CRITERIONS.get(name)
    if hasattr(cls, "from_task") and not isinstance(task_or_padding_idx, int):
        return cls.from_task(args, task_or_padding_idx)  # it checks the task's dictionaries too
    return cls.from_args(args, pad)


__all__ = [
    "CrossEntropyCriterion",
    "LabelSmoothedCrossEntropyCriterion",
    "LabelSmoothedCrossEntropyWithDistillationCriterion",
    "add_args",
    "build_criterion",
    "get_perplexity",
    "smoothed_nll_loss",
]
