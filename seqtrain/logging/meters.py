"""Meters for training statistics, fairseq style: weighted averages, sums, rates, and derived values.

A `MetersDict` is one named set of meters (e.g. "train" for the whole epoch, "train_inner" for one log interval,
"valid" for one validation pass). Its `smoothed_values()` gives the rounded numbers printed in log lines, in the
order the meters were first logged. Every meter can give and take a plain-data state (floats and ints only) so
checkpoints keep the epoch's running statistics across a resume.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


def _round(value: float, digits: int | None) -> float:
    if digits is None or not isinstance(value, float) or not math.isfinite(value):
        return value
    return round(value, digits)


class Meter:
    round: int | None = None

    def reset(self) -> None:
        raise NotImplementedError

    @property
    def smoothed_value(self) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


class AverageMeter(Meter):
    """Weighted running average (e.g. loss weighted by sample size)."""

    def __init__(self, round: int | None = None):
        self.round = round
        self.reset()

    def reset(self) -> None:
        self.val = 0.0
        self.sum = 0.0
        self.count = 0.0

    def update(self, val: float, n: float = 1) -> None:
        self.val = float(val)
        self.sum += float(val) * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.sum / self.count if self.count > 0 else self.val

    @property
    def smoothed_value(self) -> float:
        return _round(self.avg, self.round)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "avg", "val": self.val, "sum": self.sum, "count": self.count, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.val, self.sum, self.count = state["val"], state["sum"], state["count"]
        self.round = state.get("round")


class LastMeter(Meter):
    """Keeps the latest value (lr, num_updates, loss_scale)."""

    def __init__(self, round: int | None = None):
        self.round = round
        self.reset()

    def reset(self) -> None:
        self.val = 0.0

    def update(self, val: float) -> None:
        self.val = val

    @property
    def smoothed_value(self) -> float:
        return _round(self.val, self.round)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "last", "val": self.val, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.val, self.round = state["val"], state.get("round")


class SumMeter(Meter):
    """A running sum (train_wall: seconds spent inside train steps; oom: skipped updates)."""

    def __init__(self, round: int | None = None):
        self.round = round
        self.reset()

    def reset(self) -> None:
        self.sum = 0.0

    def update(self, val: float) -> None:
        self.sum += val

    @property
    def smoothed_value(self) -> float:
        return _round(self.sum, self.round)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "sum", "sum": self.sum, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sum, self.round = state["sum"], state.get("round")


class TimeMeter(Meter):
    """Rate of events per second since the meter started (wps, ups); `elapsed_time` gives wall time.

    The saved state keeps elapsed time and count, so a resumed run reports rates and wall clock that continue
    where the stopped run left off.
    """

    def __init__(self, round: int | None = None):
        self.round = round
        self.reset()

    def reset(self, init: float = 0.0, n: float = 0.0) -> None:
        self.init = init
        self.start = time.perf_counter()
        self.n = n

    def update(self, val: float = 1) -> None:
        self.n += val

    @property
    def elapsed_time(self) -> float:
        return self.init + (time.perf_counter() - self.start)

    @property
    def avg(self) -> float:
        return self.n / self.elapsed_time if self.elapsed_time > 0 else 0.0

    @property
    def smoothed_value(self) -> float:
        return _round(self.avg, self.round)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "time", "init": self.elapsed_time, "n": self.n, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset(init=state["init"], n=state["n"])
        self.round = state.get("round")


_KINDS = {"avg": AverageMeter, "last": LastMeter, "sum": SumMeter, "time": TimeMeter}


class MetersDict:
    """An ordered set of named meters plus derived values computed from them at read time."""

    def __init__(self) -> None:
        self.meters: OrderedDict[str, Meter] = OrderedDict()
        self.derived: OrderedDict[str, Callable[[MetersDict], float]] = OrderedDict()
        self._order: list = []

    def _get(self, name: str, cls: type, round: int | None) -> Any:
        meter = self.meters.get(name)
        if meter is None:
            meter = self.meters[name] = cls(round=round)
            if name not in self._order:
                self._order.append(name)
        return meter

    def log_scalar(self, name: str, value: float, weight: float = 1, round: int | None = None) -> None:
        self._get(name, AverageMeter, round).update(value, weight)

    def log_last(self, name: str, value: float, round: int | None = None) -> None:
        self._get(name, LastMeter, round).update(value)

    def log_sum(self, name: str, value: float, round: int | None = None) -> None:
        self._get(name, SumMeter, round).update(value)

    def log_speed(
        self, name: str, value: float, round: int | None = None, start: float | None = None
    ) -> None:
        """Count `value` events; the rate's clock starts when the meter is created, or at `start` (a
        time.perf_counter() value) if given then, so the work of the first logged step is timed too."""
        new = name not in self.meters
        meter = self._get(name, TimeMeter, round)
        if new and start is not None:
            meter.start = start
        meter.update(value)

    def log_derived(self, name: str, fn: Callable[[MetersDict], float]) -> None:
        if name not in self.derived:
            self.derived[name] = fn
            if name not in self._order:
                self._order.append(name)

    def __contains__(self, name: str) -> bool:
        return name in self.meters or name in self.derived

    def __getitem__(self, name: str) -> Meter:
        return self.meters[name]

    def avg(self, name: str) -> float:
        meter = self.meters[name]
        return meter.avg if hasattr(meter, "avg") else meter.smoothed_value

    def smoothed_values(self) -> OrderedDict[str, float]:
        out: OrderedDict[str, float] = OrderedDict()
        for name in self._order:
            if name in self.meters:
                out[name] = self.meters[name].smoothed_value
            elif name in self.derived:
                out[name] = self.derived[name](self)
        return out

    def reset(self) -> None:
        # Meters are dropped rather than zeroed, so rates (wps/ups) restart their clock with the next interval.
        self.meters.clear()
        self.derived.clear()
        self._order = []

    def state_dict(self) -> dict[str, Any]:
        # Derived values are functions, so only their names are kept; whoever logs them re-registers them.
        return {"order": list(self._order), "meters": {k: m.state_dict() for k, m in self.meters.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        for name, s in state["meters"].items():
            meter = _KINDS[s["kind"]]()
            meter.load_state_dict(s)
            self.meters[name] = meter
        # Derived names keep their place in the order; they show up again once re-registered.
        self._order = list(state["order"])


def perplexity(loss_base2: float, round: int = 2) -> float:
    """2 ** loss with fairseq's rounding; inf when the loss is too large to exponentiate."""
    try:
        return _round(float(2**loss_base2), round)
    except OverflowError:
        return float("inf")
