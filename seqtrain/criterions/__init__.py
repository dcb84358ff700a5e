"""Training criteria with fairseq's names: cross_entropy, label_smoothed_cross_entropy, and
label_smoothed_cross_entropy_with_distillation (word-level KD from a --teacher-path, distillation.py).

`criterion(model, sample, reduce=True) -> (loss, sample_size, logging_output)`;
`Criterion.reduce_metrics(logging_outputs) -> dict` gives the numbers fairseq logs (base 2, ppl, accuracy).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from seqtrain.config import add_choice_settings, field_default, flag_names
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
    """Flags of every registered criterion (fairseq's names, then distillation's, then a --user-dir plugin's),
    from the settings classes the criteria register with; flags already on the parser are skipped."""
    return add_choice_settings(parser, CRITERIONS.configs(), "criterion")


def build_criterion(cfg: CriterionConfig, task_or_padding_idx: Any) -> CrossEntropyCriterion:
    """Build criterion `cfg.criterion` from its settings `cfg` (an instance of CRITERIONS.config(name), read
    from the flags by the program); the second argument is a task (its target dictionary gives the pad index),
    a Dictionary, or the pad index itself."""
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
    cls = CRITERIONS.get(name)
    if not hasattr(cls, "from_config"):  # a --user-dir plugin built fairseq-style: `cfg` serves as its args
        return cls.from_args(cfg, pad)
    # the distillation criterion loads its teacher through the task and checks the task's dictionaries
    return cls.from_config(cfg, task_or_padding_idx if cls.needs_task else pad)


def check_criterion_flags(name: str, given: Callable[[str], Any]) -> None:
    """seqtrain-train lists every criterion's flags: one that criterion `name` does not read, given a value
    other than its default (`given(dest)`: the parsed value, None when unset), is refused with one line naming
    the criteria that read it (fairseq, which adds only the chosen criterion's flags, refuses it too)."""
    own = {f.name for f in fields(CRITERIONS.config(name))}
    for cls in CRITERIONS.configs():
        for f in fields(cls):
            value = given(f.name)
            if f.name in own or "flag" not in f.metadata or value is None or value == field_default(f):
                continue
            readers = [
                n for n in CRITERIONS.names() if f.name in {g.name for g in fields(CRITERIONS.config(n))}
            ]
            raise SeqtrainError(
                f"{flag_names(f)[0]} is read only by --criterion {' or '.join(readers)}, not {name}"
            )


__all__ = [
    "CriterionConfig",
    "CrossEntropyCriterion",
    "DistillationConfig",
    "LabelSmoothedCrossEntropyCriterion",
    "LabelSmoothedCrossEntropyWithDistillationCriterion",
    "add_args",
    "build_criterion",
    "check_criterion_flags",
    "get_perplexity",
    "smoothed_nll_loss",
]
