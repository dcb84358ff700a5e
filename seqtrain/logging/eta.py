"""How long until --max-update / --max-epoch: the figure a progress line shows after its position (`(eta 1h02m)`).

tqdm's own estimate covers one epoch; a run is many. The estimate is this launch's wall-clock pace (validation
and checkpoint writes included, they are part of what is left) times the updates still to go. A resumed launch
starts a new pace: the earlier launch may have run on another machine or under another load.
"""

from __future__ import annotations

import math
import time


def format_duration(seconds: float) -> str:
    """45s, 12m30s, 3h05m, 2d04h: two units at most, as a person reads a countdown."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Eta:
    """The time left to `target` updates (None: no --max-update/--max-epoch, so none to tell)."""

    def __init__(self, start_updates: int, clock=time.monotonic):
        self.clock = clock
        self.start_updates = start_updates
        self.start = clock()
        self.target: int | None = None

    def set_target(
        self, max_update: int, max_epoch: int, epoch: int, epoch_start_updates: int, per_epoch: int
    ):
        """--max-update, or the updates --max-epoch reaches at this epoch's size (`per_epoch` updates, the
        current one starting at `epoch_start_updates`); the nearer of the two when both are given."""
        targets = []
        if max_update > 0:
            targets.append(max_update)
        if max_epoch > 0 and per_epoch > 0:
            targets.append(epoch_start_updates + per_epoch * (max_epoch - epoch + 1))
        self.target = min(targets) if targets else None

    def seconds_left(self, updates: int) -> float | None:
        done = updates - self.start_updates
        if self.target is None or done <= 0:
            return None
        pace = (self.clock() - self.start) / done
        return max(0, self.target - updates) * pace

    def text(self, updates: int) -> str | None:
        left = self.seconds_left(updates)
        return None if left is None or not math.isfinite(left) else format_duration(left)
