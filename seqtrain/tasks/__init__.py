"""Tasks: what data a run reads and how one step uses it. Importing this package registers them in TASKS."""

from __future__ import annotations

from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.registry import TASKS
from seqtrain.tasks.denoising import DenoisingTask
from seqtrain.tasks.translation import TranslationTask
from seqtrain.tasks.translation_from_pretrained_bart import TranslationFromPretrainedBARTTask


def task_class(name: str | None) -> Any:
    """The registered task `name` (default translation); its settings class: TASKS.config(name)."""
    name = name or "translation"
    if name not in TASKS:
        raise SeqtrainError(f"--task: unknown task {name!r}; choose from: {', '.join(TASKS.names())}")
    return TASKS.get(name)


def setup_task(cfg: Any) -> Any:
    """Build task `cfg.task` from its settings (an instance of TASKS.config(name)): dictionaries, tokenizer
    spec. A --user-dir task gets its config as fairseq's tasks get their args (attribute access works the same)."""
    return task_class(cfg.task).setup_task(cfg)


__all__ = [
    "DenoisingTask",
    "TranslationFromPretrainedBARTTask",
    "TranslationTask",
    "setup_task",
    "task_class",
]
