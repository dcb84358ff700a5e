"""TensorBoard scalars, one event folder per tag (train_inner, train, valid), as fairseq lays them out."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from seqtrain.logging.trackers import Tracker, numeric_stats


class TensorboardWriter(Tracker):
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

    def log(self, tag: str, stats: Mapping[str, Any], step: int) -> None:
        writer = self._writer(tag)
        for key, value in numeric_stats(stats).items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
