"""Typed settings: each component declares its settings once, beside its code, as a dataclass whose fields are
also its command-line flags; the CLIs' parsers are built from those classes, and components read their flags once,
into the dataclass, instead of from the Namespace.

A field made with `setting(default, help, ...)` carries its flag: the names (default `--field-name`), the help,
argparse's keywords (type, action, metavar, choices, nargs) and its range (`bounds=`, seqtrain.flag_bounds.Bounds).
`@settings` on the dataclass registers those ranges with seqtrain.flag_bounds (checked at parse time, on the command
line and in --config files alike); `add_settings(parser, cls, title)` adds the flags as an argument group.
A program composes its parser from the classes it uses; a field with `not_in=("interactive",)` is a flag of the
group everywhere but there: `add_settings(..., program="interactive")` leaves it out, keeps its default, and
lists it in `left_out(parser)`, which the parser refuses with one line ("does nothing in PROG").

`from_args(cls, args)` fills a dataclass's fields from the parsed flags of the same names; a flag the
Namespace lacks (a library caller's hand-made Namespace) or leaves at None keeps the field's default. A field
`x: Other = field(default_factory=Other)` nests another settings class, filled from the same flags: a component's
config composes the groups it reads instead of repeating their fields.
Flag implications (e.g. --memory-efficient-fp16 => --fp16) are applied once, by seqtrain.flags.parsing when parsing.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, NamedTuple, TypeVar

from seqtrain import flag_bounds

T = TypeVar("T")


class Flag(NamedTuple):
    """What a settings field adds to argparse besides its dest (the field name) and default (the field's)."""

    names: tuple[str, ...]  # empty: --field-name
    help: str
    kwargs: dict[
        str, Any
    ]  # argparse's add_argument keywords (type, action, metavar, choices, nargs, default)


def setting(
    default: Any = None,
    help: str = "",  # noqa: A002 (argparse's name)
    *,
    flags: tuple[str, ...] | str = (),
    bounds: flag_bounds.Bounds | None = None,
    flag_default: Any = MISSING,
    not_in: tuple[str, ...] = (),
    **kwargs: Any,
) -> Any:
    """A dataclass field that is also a flag. A list default is copied per instance (default_factory).
    `kwargs` go to add_argument as they are; `flag_default` is the flag's default where it differs from the
    field's (argparse.SUPPRESS, or a flag whose parsed value is None until a later stage fills it: the model's
    flags, which the --arch preset fills)."""
    names = (flags,) if isinstance(flags, str) else tuple(flags)
    if flag_default is not MISSING:  # (`default` names the field's default: the flag's comes by this name)
        kwargs["default"] = flag_default
    metadata = {"flag": Flag(names, help, kwargs), "bounds": bounds, "not_in": tuple(not_in)}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def settings(cls: type[T]) -> type[T]:
    """Make `cls` a dataclass and register its fields' ranges with seqtrain.flag_bounds (by field name, the
    flag's dest). A range declared twice must be the same range."""
    cls = dataclass(cls)
    for f in fields(cls):  # type: ignore[arg-type]
        b = f.metadata.get("bounds")
        if b is None:
            continue
        known = flag_bounds.BOUNDS.setdefault(f.name, b)
        if known != b:
            raise ValueError(f"{cls.__name__}.{f.name}: range {b} differs from the registered {known}")
    return cls


def flag_names(f: Field) -> tuple[str, ...]:
    meta: Flag = f.metadata["flag"]
    return meta.names or ("--" + f.name.replace("_", "-"),)


def field_default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]


def left_out(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The flags of the groups `parser` composes that its program leaves out (flag -> its dest): given on the
    command line, each is refused with one line, as doing nothing there."""
    return parser.__dict__.setdefault("left_out_flags", {})


def leave_out(parser: argparse.ArgumentParser, names: Any, dest: str) -> None:
    """Record flags `names` (of dest `dest`) as left out of `parser`'s program (see left_out)."""
    for n in names:
        left_out(parser)[n] = dest


def add_settings(
    parser: argparse.ArgumentParser,
    cls: type,
    title: str | None = None,
    group: Any = None,
    program: str | None = None,
) -> Any:
    """Add the flags of settings class `cls` to `parser`, in field order, in `group` or a new argument group
    titled `title` (default: the class's first docstring line). A flag the parser already has is skipped: the
    component that declared it first owns it (fairseq's rule for flags two components share). A field whose
    `not_in` names `program` is left out (its default kept, its flags in left_out(parser)). Returns the group."""
    if group is None:
        group = parser.add_argument_group(title or (cls.__doc__ or cls.__name__).strip().split("\n")[0])
    for f in fields(cls):
        meta: Flag | None = f.metadata.get("flag")
        if meta is None:
            continue
        names = flag_names(f)
        if any(n in parser._option_string_actions for n in names):
            continue
        if program is not None and program in f.metadata.get("not_in", ()):
            leave_out(parser, names, f.name)
            parser.set_defaults(**{f.name: field_default(f)})
            continue
        kwargs = dict(meta.kwargs)
        if callable(kwargs.get("choices")):  # a registry's names, read when the parser is built (plugins)
            kwargs["choices"] = kwargs["choices"]()
        if kwargs.get("action") not in ("store_true", "store_false", "help", "version"):
            kwargs.setdefault("default", field_default(f))
        if names[0].startswith("-"):  # (a positional argument's dest is its name: the field's)
            kwargs["dest"] = f.name
        group.add_argument(*names, help=meta.help, **kwargs)
    return group


def add_choice_settings(
    parser: argparse.ArgumentParser, classes: list[type], title: str, group: Any = None
) -> Any:
    """Add the flags of the settings `classes` of a kind's components (a chosen one's, or every registered
    one's: seqtrain.registry's config / configs) to one group, titled `title` (or to `group`), skipping flags
    the parser already has. A flag the classes give different defaults defaults to None: the chosen
    component's settings then keep their own (from_args leaves a None flag at the field's default)."""
    defaults: dict[str, set] = {}
    for cls in classes:
        for f in fields(cls):
            defaults.setdefault(f.name, set()).add(repr(field_default(f)))
    group = group if group is not None else parser.add_argument_group(title)
    for cls in classes:
        add_settings(parser, cls, group=group)
    for action in group._group_actions:
        if len(defaults.get(action.dest, ())) > 1:
            action.default = None
    return group


def int_list(value: Any) -> list[int]:
    """fairseq's list-valued int flags (--update-freq): "2", "1,2,4", "[1, 2]" or an int/list."""
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    text = str(value).strip().strip("[]()")
    try:
        out = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or comma-separated integers, got {value!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected an integer or comma-separated integers, got {value!r}")
    return out


def from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if is_dataclass(f.default_factory):  # a nested settings class: read from the same flags
            values[f.name] = from_args(f.default_factory, args)  # type: ignore[arg-type]
            continue
        value = getattr(args, f.name, None)
        if value is not None:
            values[f.name] = value
    values.update(overrides)
    return cls(**values)
