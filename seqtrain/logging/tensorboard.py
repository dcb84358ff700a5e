"""TensorBoard scalars, one event folder per tag (train_inner, train, valid), as fairseq lays them out."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import Any


class TensorboardWriter:
    """Writes numeric stats as scalars under `{logdir}/{tag}`; non-numeric values are skipped."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writers: dict[str, Any] = {}

    def _writer(self, tag: str):
        if tag not in self._writers:
            # Imported here so that runs without --tensorboard-logdir never pay for (or need) tensorboard.
            from torch.utils.tensorboard import SummaryWriter

            self._writers[tag] = SummaryWriter(os.path.join(self.logdir, tag))
        return self._writers[tag]

    def log_scalars(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        writer = self._writer(tag)
        for key, value in stats.items():
            if key == "num_updates" or isinstance(value, bool) or not isinstance(value, numbers.Number):
                continue
            value = float(value)
            if math.isfinite(value):
                writer.add_scalar(key, value, step)
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
