"""Typed settings: each component reads its flags once, into a dataclass, instead of from the Namespace.

`from_args(cls, args)` fills a dataclass's fields from the parsed flags of the same names; a flag the
Namespace lacks (a library caller's hand-made Namespace) or leaves at None keeps the field's default.
Flag implications (e.g. --memory-efficient-fp16 => --fp16) are applied once, by seqtrain.options when parsing.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
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
