"""Tasks: what data a run reads and how one step uses it. Importing this package registers them in TASKS."""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.registry import TASKS
from seqtrain.tasks.denoising import DenoisingTask
from seqtrain.tasks.translation import TranslationTask
from seqtrain.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask


def setup_task(args: argparse.Namespace) -> Any:
    """Build `args.task` (default translation) from args: dictionaries, tokenizer spec."""
    name = getattr(args, "task", None) or "translation"
    if name not in TASKS:
        raise SeqtrainError(f"--task: unknown task {name!r}; choose from: {', '.join(TASKS.names())}")
    return TASKS.get(name).setup_task(args)


__all__ = ["DenoisingTask", "TranslationFromPretrainedBARTTask", "TranslationTask", "setup_task"]
