"""`--config FILE`: flag defaults from a JSON object or YAML-style `key: value` lines, checked like flags.

Keys are flag names (with - or _); each value is converted as argparse would convert it on the command line, and
a bad key or value is an error naming the file, the line and the key. seqtrain.options applies the file between
the command line and the `--arch` preset.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from seqtrain.data.options import str2bool
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value


def _parse_scalar(text: str) -> Any:
    text = text.strip()
    if not text or text in ("~", "null", "None"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        return [_parse_scalar(part) for part in text[1:-1].split(",") if part.strip()]
    return text


def load_config(path: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a config file: JSON object, or YAML-style `key: value` lines (# comments). Returns (values,
    line number of each key; 0 for JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SeqtrainError(f"--config {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise SeqtrainError(f"--config {path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if text.lstrip().startswith("{"):
        try:
            values = json.loads(text)
        except ValueError as e:
            raise SeqtrainError(f"--config {path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        if not isinstance(values, dict):
            raise SeqtrainError(f"--config {path}: expected a JSON object of flag values")
        return values, {k: 0 for k in values}
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() == "---":
            continue
        if line[0].isspace() or ":" not in line:
            raise SeqtrainError(
                f"--config {path} line {n}: expected `key: value` (no nesting), got {raw.strip()!r}"
            )
        key, value = line.split(":", 1)
        values[key.strip()] = _parse_scalar(value)
        lines[key.strip()] = n
    return values, lines


def _convert(action: argparse.Action, value: Any, where: str) -> Any:
    """Turn a config value into what argparse would have produced for it on the command line."""
    if value is None:
        return None
    try:
        if isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
        ):
            return str2bool(value)
        convert = action.type or (lambda v: v)
        if action.nargs in ("+", "*") or isinstance(action.nargs, int):
            items = value if isinstance(value, list) else [value]
            out = [
                convert(v if not isinstance(v, (int, float)) or action.type in (None, str) else v)
                for v in items
            ]
            out = [str(v) if action.type is str else v for v in out]
        elif isinstance(value, list) and action.type is not None and action.type not in (int, float, str):
            out = convert(value)  # list-valued types (int_list, lr lists) accept lists
        elif isinstance(value, (dict, list)):
            out = json.dumps(value) if action.type in (None, str) else convert(value)
        elif action.type in (None, str):
            out = str(value)
        else:
            out = convert(value if action.type in (int, float) else str(value))
        check_value(action.dest, out)
    except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
        raise SeqtrainError(f"{where}: invalid value {value!r} ({e})") from None
    if action.choices is not None:
        for v in out if isinstance(out, list) and action.nargs else [out]:
            if v not in action.choices:
                raise SeqtrainError(f"{where}: {v!r} is not one of {', '.join(map(str, action.choices))}")
    return out


def actions_by_key(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in ("help", "config"):
            continue
        out[action.dest] = action
        for flag in action.option_strings:
            out[flag.lstrip("-")] = action
            out[flag.lstrip("-").replace("-", "_")] = action
    return out


def apply_config(
    parser: argparse.ArgumentParser,
    path: str,
    values: dict[str, Any],
    lines: dict[str, int],
    strict: bool = True,
    ignore: dict[str, argparse.Action] | None = None,
) -> None:
    """Set config values as parser defaults. With strict, a key that is no flag of this parser is an error,
    unless it is a key of `ignore` (the flags of the other CLI: one config serves training and generation)."""
    by_key = actions_by_key(parser)
    defaults: dict[str, Any] = {}
    for key, value in values.items():
        where = f"--config {path}" + (f" line {lines.get(key)}" if lines.get(key) else "") + f" ({key})"
        action = by_key.get(key.lstrip("-")) or by_key.get(key.lstrip("-").replace("-", "_"))
        if action is None:
            other = (ignore or {}).get(key.lstrip("-")) or (ignore or {}).get(
                key.lstrip("-").replace("-", "_")
            )
            if other is not None:
                _convert(other, value, where)  # a bad value is an error even for the CLI that skips the key
                continue
            if strict:
                import difflib

                close = difflib.get_close_matches(
                    key.lstrip("-"), [k for k in {**by_key, **(ignore or {})} if "_" not in k], n=1
                )
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise SeqtrainError(f"{where}: unknown option {key!r}{hint}")
            continue
        defaults[action.dest] = _convert(action, value, where)
        if not action.option_strings:
            # A positional (DATA) given in the config becomes optional on the command line.
            action.nargs, action.required = "?", False
        elif action.required:
            action.required = False
    parser.set_defaults(**defaults)
