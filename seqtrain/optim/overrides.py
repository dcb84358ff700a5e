"""--optimizer-overrides: saved optimizer settings replaced on resume (fairseq's flag), checked first against the
settings the optimizer has."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch

from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value

# the flag whose range (seqtrain.flag_bounds) an optimizer setting of this name takes
_OVERRIDE_BOUNDS = {"lr": "lr", "weight_decay": "weight_decay", "eps": "adam_eps", "momentum": "momentum"}


def check_optimizer_overrides(overrides: Any, group: dict) -> dict:
    """--optimizer-overrides, checked against an optimizer's param group before anything is replaced: a JSON
    object whose keys are settings the group has, each value of the kind the group holds (a number for a
    number, finite and in its flag's range; a list of as many numbers for a tuple such as betas, each in
    [0, 1) for betas; true / false for a switch). Returns the overrides, lists made tuples where the group
    holds tuples. Before, '[1]' or '{"betas": 5}' ended a resume with a TypeError traceback, at the first step."""
    if not isinstance(overrides, dict):
        raise SeqtrainError(f"--optimizer-overrides: not a JSON object: {overrides!r}")
    known = sorted(k for k in group if k != "params")
    out = {}
    for key, value in overrides.items():
        if key not in known:
            raise SeqtrainError(
                f"--optimizer-overrides: {key!r} is no setting of this optimizer (it has: {', '.join(known)})"
            )
        have = group[key]
        bad = SeqtrainError(
            f"--optimizer-overrides: {key}={value!r} does not fit the optimizer's {key}={have!r}"
        )
        if isinstance(have, bool) or have is None:
            if not isinstance(value, bool) and not (have is None and value is None):
                raise bad
        elif isinstance(have, (int, float, torch.Tensor)):
            value = _override_number(key, value, bad)
        elif isinstance(have, (tuple, list)):
            if not isinstance(value, (tuple, list)) or len(value) != len(have):
                raise bad
            value = type(have)(_override_number(key, v, bad) for v in value)
            if key == "betas" and not all(0 <= v < 1 for v in value):
                raise SeqtrainError(f"--optimizer-overrides: betas={list(value)!r}: each must be in [0, 1)")
        elif type(value) is not type(have):
            raise bad
        out[key] = value
    return out


def _override_number(key: str, value: Any, bad: SeqtrainError) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad
    if key in _OVERRIDE_BOUNDS:
        try:
            check_value(_OVERRIDE_BOUNDS[key], float(value))
        except argparse.ArgumentTypeError as e:
            raise SeqtrainError(f"--optimizer-overrides: {key}={value!r}: {e}") from None
    return value
