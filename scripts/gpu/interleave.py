"""Alternated samples for the fair GPU comparisons (issue 49; scripts/gpu/stage_fair.py): several engines (the
toolkits' settings) run the same items in rounds, each round every engine once, the order rotated each round so
that no engine always runs first or always after the same one (a warmer device, a fuller allocator cache); then
the median and the spread (quartiles, min-max) of each engine's samples, the fastest engine of each toolkit (the
least median seconds), and the ratio of two engines' medians with the spread of their per-round ratios.

Plain Python (no torch): the sampler takes a `timer` that runs a callable and returns its seconds (synchronising
the device around it), so tests/repo/test_gpu_interleave.py checks the order, the statistics and the choices in
milliseconds."""

from __future__ import annotations

import math
import statistics
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Engine:
    """One setting of one toolkit: `run(item)` does the work on `item` (one training update, one generation
    pass); `enter` and `leave` (optional) set and restore what this engine needs around each call (the cuDNN
    attention switch, transformers' attention implementation, a compiled forward)."""

    name: str
    toolkit: str
    run: Callable[[Any], Any]
    enter: Callable[[], None] | None = None
    leave: Callable[[], None] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __call__(self, item: Any) -> Any:
        if self.enter is not None:
            self.enter()
        try:
            return self.run(item)
        finally:
            if self.leave is not None:
                self.leave()


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round `r`'s order: the engines' order shifted by r, so each engine leads one round in len(names)."""
    k = r % len(names) if names else 0
    return [*names[k:], *names[:k]]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method: within the samples' range), min, max and count of `samples`."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(samples)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0], 0, xs[0])
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1], "n": len(xs)}


def fastest(medians: dict[str, float]) -> str:
    """The engine with the least median (the first named on a tie)."""
    return min(medians, key=lambda name: (medians[name], list(medians).index(name)))


def rounds_that_fit(left_s: float, round_s: float, target: int, minimum: int = 1) -> int:
    """How many rounds of `round_s` seconds fit in `left_s`: `target` if they all fit, else as many as fit but
    never fewer than `minimum` (a run that cannot afford them says so in its record)."""
    if round_s <= 0 or math.isinf(left_s):
        return target
    return max(minimum, min(target, int(left_s // round_s)))


@dataclass
class Alternated:
    """What `alternate` measured: each engine's seconds per round, each round's order, the engines that failed
    during the rounds (name -> error) and left the later rounds."""

    samples: dict[str, list[float]]
    order: list[list[str]]
    failed: dict[str, str]
    tracebacks: dict[str, str]


def alternate(
    engines: Sequence[Engine],
    items: Sequence[Any],
    rounds: int,
    timer: Callable[[Callable[[], Any]], float],
    after_failure: Callable[[], None] | None = None,
) -> Alternated:
    """`rounds` rounds; in round r every engine runs item r (cycling through `items`), in rotated(r) order;
    each call timed by `timer`. An engine that raises is dropped from the later rounds (its error kept), the
    others go on; `after_failure` runs after such an error (to free the device's memory)."""
    names = [e.name for e in engines]
    by_name = {e.name: e for e in engines}
    samples: dict[str, list[float]] = {n: [] for n in names}
    failed: dict[str, str] = {}
    tracebacks: dict[str, str] = {}
    order = []
    for r in range(rounds):
        this = [n for n in rotated(names, r) if n not in failed]
        if not this:
            break
        item = items[r % len(items)]
        for name in this:
            try:
                samples[name].append(timer(lambda e=by_name[name], x=item: e(x)))
            except Exception as e:
                failed[name] = f"round {r}: {type(e).__name__}: {str(e)[:300]}"
                tracebacks[name] = traceback.format_exc()[-1500:]
                if after_failure is not None:
                    after_failure()
        order.append(this)
    return Alternated(samples, order, failed, tracebacks)


def ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """a's median over b's (how many times b's speed a is, for seconds), and the median, min and max of the
    per-round ratios a[r] / b[r] over the rounds both ran."""
    per_round = [x / y for x, y in zip(a, b) if y > 0]
    out = {"ratio": statistics.median(a) / statistics.median(b)}
    if per_round:
        s = summary(per_round)
        out.update(rounds_median=s["median"], rounds_min=s["min"], rounds_max=s["max"])
    return out


def record(prefix: str, stats: dict[str, float], unit: str, scale: float = 1.0) -> dict[str, float]:
    """`stats` (a summary) as flat figures: {prefix}_{unit}_median, _q1, _q3, _min, _max (times `scale`) and
    {prefix}_samples."""
    out = {f"{prefix}_{unit}_{k}": stats[k] * scale for k in ("median", "q1", "q3", "min", "max")}
    out[f"{prefix}_samples"] = int(stats["n"])
    return out
