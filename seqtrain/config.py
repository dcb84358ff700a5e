"""Typed settings: each component reads its flags once, into a dataclass, instead of from the Namespace.

`from_args(cls, args)` fills a dataclass's fields from the parsed flags of the same names; a flag the
Namespace lacks (a library caller's hand-made Namespace) or leaves at None keeps the field's default.
Flag implications (e.g. --memory-efficient-fp16 => --fp16) are applied once, by seqtrain.flags.parsers when parsing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T")


def from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = getattr(args, f.name, None)
        if value is not None:
            values[f.name] = value
    values.update(overrides)
    return cls(**values)


@dataclass
class CheckpointConfig:
    """The checkpoint flags of a training run (seqtrain.train.checkpoints.CheckpointManager): where and when to
    save, what to keep, where to resume from, and --patience."""

    save_dir: str = "checkpoints"
    restore_file: str = "checkpoint_last.pt"
    restore_file_always: bool = False
    finetune_from_model: str | None = None
    reset_optimizer: bool = False
    reset_lr_scheduler: bool = False
    reset_meters: bool = False
    reset_dataloader: bool = False
    optimizer_overrides: str = "{}"
    save_interval: int = 1
    save_interval_updates: int = 0
    keep_interval_updates: int = -1
    keep_last_epochs: int = -1
    keep_best_checkpoints: int = -1
    no_save: bool = False
    no_epoch_checkpoints: bool = False
    no_last_checkpoints: bool = False
    no_save_optimizer_state: bool = False
    best_checkpoint_metric: str = "loss"
    maximize_best_checkpoint_metric: bool = False
    patience: int = -1
    unsafe_load: bool = False
    distributed_rank: int = 0
    distributed_world_size: int = 1
