"""Training criteria with fairseq's names: cross_entropy, label_smoothed_cross_entropy, and
label_smoothed_cross_entropy_with_distillation (word-level KD from a --teacher-path, distillation.py).

`criterion(model, sample, reduce=True) -> (loss, sample_size, logging_output)`;
`Criterion.reduce_metrics(logging_outputs) -> dict` gives the numbers fairseq logs (base 2, ppl, accuracy).
"""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.config import add_settings
from seqtrain.config import from_args as read_settings
from seqtrain.criterions import distillation
from seqtrain.criterions.cross_entropy import (
    CriterionConfig,
    CrossEntropyCriterion,
    get_perplexity,
    smoothed_nll_loss,
)
from seqtrain.criterions.distillation import (
    DistillationConfig,
    LabelSmoothedCrossEntropyWithDistillationCriterion,
)
from seqtrain.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from seqtrain.errors import SeqtrainError
from seqtrain.registry import CRITERIONS


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Flags of the criteria (fairseq names, then distillation's); flags already on the parser are skipped."""
    group = add_settings(parser, CriterionConfig, "criterion")
    add_settings(parser, DistillationConfig, group=group)
    return group


def build_criterion(cfg: DistillationConfig, task_or_padding_idx: Any) -> CrossEntropyCriterion:
    """Build criterion `cfg.criterion` from `cfg`, every criterion flag (the criteria's settings classes are
    DistillationConfig's bases); the second argument is a task (its target dictionary gives the pad index), a
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
    name = cfg.criterion
    if name not in CRITERIONS:
        raise SeqtrainError(
            f"--criterion: unknown criterion {name!r}; choose from: {', '.join(CRITERIONS.names())}"
        )
    if cfg.teacher_path and name != distillation.NAME:
        raise SeqtrainError(f"--teacher-path is read only by --criterion {distillation.NAME}, not {name}")
    cls = CRITERIONS.get(name)
    if not hasattr(cls, "from_config"):  # a --user-dir plugin built fairseq-style: `cfg` serves as its args
        return cls.from_args(cfg, pad)
    # the distillation criterion loads its teacher through the task and checks the task's dictionaries
    return cls.from_config(read_settings(cls.config, cfg), task_or_padding_idx if cls.needs_task else pad)


__all__ = [
    "CriterionConfig",
    "CrossEntropyCriterion",
    "DistillationConfig",
    "LabelSmoothedCrossEntropyCriterion",
    "LabelSmoothedCrossEntropyWithDistillationCriterion",
    "add_args",
    "build_criterion",
    "get_perplexity",
    "smoothed_nll_loss",
]
