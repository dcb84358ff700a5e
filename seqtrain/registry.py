"""One small registry for named components (archs, tasks, criterions, optimizers, schedulers, tokenizers).

A registry maps a name to a builder and to the builder's settings class: a component registers both at once,
`@OPTIMIZERS.register("adam", config=AdamConfig)`, as fairseq registers a dataclass with each component
(`register_optimizer("adam", dataclass=FairseqAdamConfig)`), and `config(name)` is the one way to find the
settings of a chosen component: the parsers add its flags from that class and the programs read the flags into
it. A component registered without one (a --user-dir plugin written fairseq-style) takes its kind's `common`
settings, the ones every component of the kind reads (an optimizer's learning rate), which the module declaring
them names. A tokenizer is rebuilt from the spec a data-bin or checkpoint stores, not from flags: it has none.

No global mutable state beyond the tables themselves, which are filled at import time by decorators in the modules
that define the components (a --user-dir plugin's when it is imported).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._configs: dict[str, type | None] = {}
        self.common: type | None = None  # the settings of a component registered without its own

    def register(self, name: str, *aliases: str, config: type | None = None) -> Callable[[T], T]:
        """Register the decorated builder as `name` (and `aliases`), with its settings class `config` (None: a
        --user-dir component written fairseq-style, which takes the settings its kind shares)."""

        def deco(obj: T) -> T:
            for n in (name,) + aliases:
                if n in self._entries:
                    raise ValueError(f"{self.kind} {n!r} is registered twice")
                self._entries[n] = obj
                self._configs[n] = config
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Forget `name` (a test's made component, registered for the test only)."""
        self._entries.pop(name, None)
        self._configs.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; choose from: {', '.join(sorted(self._entries))}"
            ) from None

    def config(self, name: str) -> type | None:
        """The settings class of component `name`: the one registered with it, else the kind's `common` one
        (None for a kind without settings); KeyError naming the choices for an unknown name."""
        self.get(name)
        return self._configs[name] or self.common

    def registered_config(self, name: str) -> type | None:
        """The settings class `name` was registered with (None: none; see config)."""
        self.get(name)
        return self._configs[name]

    def configs(self) -> list[type]:
        """Every registered settings class once, in the order of registration."""
        return list(dict.fromkeys(c for c in self._configs.values() if c is not None))

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
