"""Range checks for every numeric flag of every CLI, applied at parse time (command line and --config alike).

seqtrain's ArgumentParser runs `check_value` on each value an int or float flag produces (also on each element of
list-valued flags such as --lr and --update-freq): floats must be finite, and every value must lie in the flag's
range. `BOUNDS` names the flags whose range differs from the default one (ints: 0 to 2^31 - 1; floats: 0 to 1e9);
`OFF` is the sentinel some flags take for "off / unlimited" (fairseq's -1), accepted besides the range.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, NamedTuple

INT_MAX = 2**31 - 1
FLOAT_MAX = 1e9


class Bounds(NamedTuple):
    lo: float
    hi: float
    lo_open: bool = False  # lo itself is excluded (a value must be > lo)
    off: float | None = None  # a sentinel accepted outside the range (fairseq's -1: off / unlimited)


POSITIVE_INT = Bounds(1, INT_MAX)
PROBABILITY = Bounds(0, 1)
POSITIVE_FLOAT = Bounds(0, FLOAT_MAX, lo_open=True)
OFF_OR_COUNT = Bounds(0, INT_MAX, off=-1)

BOUNDS: dict[str, Bounds] = {
    # (the ranges of settings classes are declared with their fields: seqtrain.config.setting's bounds=)
    "tune_subset": POSITIVE_INT,  # seqtrain-tune's sample
    "tune_bootstrap": Bounds(1, 1_000_000),  # seqtrain-tune's resamples
}


def bounds_for(dest: str, kind: type) -> Bounds:
    return BOUNDS.get(dest, Bounds(0, INT_MAX if kind is int else FLOAT_MAX))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def describe(b: Bounds) -> str:
    if b.lo_open:
        text = f"above {_fmt(b.lo)} and at most {_fmt(b.hi)}"
    else:
        text = f"between {_fmt(b.lo)} and {_fmt(b.hi)}"
    return f"{_fmt(b.off)} (off) or {text}" if b.off is not None else text


def check_value(dest: str, value: Any) -> Any:
    """Return `value` (a number or a list of numbers) if every number in it is finite and in `dest`'s range;
    raise argparse.ArgumentTypeError otherwise. Other values pass unchanged."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {v}")
        b = bounds_for(dest, type(v))
        if b.off is not None and v == b.off:
            continue
        if v < b.lo or v > b.hi or (b.lo_open and v == b.lo):
            raise argparse.ArgumentTypeError(f"must be {describe(b)}, got {_fmt(v) if abs(v) < 1e16 else v}")
    return value
