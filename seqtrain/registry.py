"""One small registry for named components (archs, tasks, criterions, optimizers, schedulers, tokenizers).

A registry maps a name to a builder. No global mutable state beyond the tables themselves, which are filled
at import time by decorators in the modules that define the components.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            for n in (name,) + aliases:
                if n in self._entries:
                    raise ValueError(f"{self.kind} {n!r} is registered twice")
                self._entries[n] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; choose from: {', '.join(sorted(self._entries))}"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> Iterable[str]:
        return sorted(self._entries)


ARCHS: Registry[Callable] = Registry("arch")
TASKS: Registry[Callable] = Registry("task")
CRITERIONS: Registry[Callable] = Registry("criterion")
OPTIMIZERS: Registry[Callable] = Registry("optimizer")
LR_SCHEDULERS: Registry[Callable] = Registry("lr scheduler")
TOKENIZERS: Registry[Callable] = Registry("tokenizer")
