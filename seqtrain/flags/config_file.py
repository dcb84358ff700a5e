"""`--config FILE`: flag defaults from a YAML file (PyYAML safe_load) or a JSON object, checked like flags.

Keys are flag names (with - or _), at the top level or in sections (nested mappings, any names: the section
names only group); each value is converted as argparse would convert it on the command line, and a bad key or
value is an error naming the file, the line and the key. seqtrain.flags.parsing applies the file between the command
line and the `--arch` preset, and `config_text` writes the resolved flags of a run back as such a file.
"""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any

from seqtrain.data.options import str2bool
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import MAX_INT_DIGITS, MAX_NESTING, JSONBoundsError, loads_bounded
from seqtrain.flag_bounds import check_value


def _json_valued(key: str) -> bool:
    """Flags whose value is a JSON object (--optimizer-overrides, --model-overrides, --eval-rouge-args): a
    mapping under such a key is the flag's value, not a section."""
    key = key.lstrip("-").replace("-", "_")
    return key.endswith("_overrides") or key.endswith("_args")


def _flatten(
    path: str,
    values: dict[str, Any],
    lines: dict[str, int],
    out: dict[str, Any],
    out_lines: dict[str, int],
    sections: dict[str, int],
) -> None:
    for key, value in values.items():
        key = str(key)
        if isinstance(value, dict) and not _json_valued(key):
            sections.setdefault(key, lines.get(key, 0))  # type: ignore[arg-type]
            _flatten(path, value, lines.get(f"{key}.", {}), out, out_lines, sections)  # type: ignore[arg-type]
            continue
        if key in out:
            where = f" line {lines[key]}" if lines.get(key) else ""
            raise SeqtrainError(f"--config {path}{where}: {key!r} is given twice (in two sections)")
        out[key] = value
        out_lines[key] = lines.get(key, 0)  # type: ignore[assignment]


def _key_lines(node: Any) -> dict[str, Any]:
    """Line of each key of a YAML mapping node; a nested mapping's lines under "KEY." (yaml.compose keeps
    marks, safe_load does not)."""
    import yaml  # PyYAML loads only when a --config file is given

    out: dict[str, Any] = {}
    if not isinstance(node, yaml.MappingNode):
        return out
    for key_node, value_node in node.value:
        key = str(key_node.value)
        out[key] = key_node.start_mark.line + 1
        if isinstance(value_node, yaml.MappingNode):
            out[f"{key}."] = _key_lines(value_node)
    return out


MAX_CONFIG_BYTES = (
    1 << 20
)  # a config lists flags: a few KiB; 1 MiB leaves room and reads in well under a second


def _yaml_loader(path: str, text: str) -> Any:
    """A PyYAML SafeLoader over `text` that refuses, while composing (before any value is built): aliases
    (`*name`, also in `<<` merges: an alias bomb of 500 bytes builds gigabytes), nesting deeper than
    MAX_NESTING, a key given twice in one mapping (safe_load keeps the last silently) and integers of more
    than MAX_INT_DIGITS digits (Python's int-str limit is a bare ValueError), each naming the line."""
    import yaml  # PyYAML loads only when a --config file is given

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise SeqtrainError(
                    f"--config {path} line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                    "supported; write the value out"
                )
            self.depth += 1
            try:
                if self.depth > MAX_NESTING:
                    line = self.peek_event().start_mark.line + 1
                    raise SeqtrainError(
                        f"--config {path} line {line}: nested more than {MAX_NESTING} levels deep"
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_mapping_node(self, anchor: Any) -> Any:
            node = super().compose_mapping_node(anchor)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = (key_node.tag, key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
                line = key_node.start_mark.line + 1
                if key is not None and key in seen:
                    raise SeqtrainError(
                        f"--config {path} line {line}: {key_node.value!r} is given twice (also line {seen[key]})"
                    )
                if key is not None:
                    seen[key] = line
            return node

        def construct_yaml_int(self, node: Any) -> Any:
            digits = str(self.construct_scalar(node)).lstrip("+-").replace("_", "")
            if len(digits) > MAX_INT_DIGITS:
                raise SeqtrainError(
                    f"--config {path} line {node.start_mark.line + 1}: an integer of {len(digits)} digits "
                    f"(at most {MAX_INT_DIGITS})"
                )
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    return Loader(text)


def _read_text(path: str) -> str:
    """The file's text, at most MAX_CONFIG_BYTES of it (checked before reading: a 100 MB file took 71 s)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise SeqtrainError(f"--config {path}: cannot read ({e.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise SeqtrainError(
            f"--config {path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; a config file lists flags (a few KiB)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SeqtrainError(f"--config {path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def load_config(path: str) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    """Read a config file: a JSON object, or YAML (PyYAML's safe_load). Sections (nested mappings) are
    flattened: {optimization: {lr: 0.1}} is lr: 0.1. Returns (values by flag name, line number of each key
    (0 where unknown), the section names with their lines: apply_config refuses one named like a flag). Sizes
    are bounded before anything is built: the file (MAX_CONFIG_BYTES), its nesting (MAX_NESTING), integers
    (MAX_INT_DIGITS); YAML aliases and keys given twice are refused."""
    import yaml  # PyYAML loads only when a --config file is given

    text = _read_text(path)
    if text.lstrip().startswith("{"):
        try:
            values = loads_bounded(text, unique_keys=True)
        except JSONBoundsError as e:
            raise SeqtrainError(f"--config {path}: {e.msg}") from None
        except ValueError as e:
            raise SeqtrainError(f"--config {path}: invalid JSON at line {e.lineno}: {e.msg}") from None
        lines: dict[str, Any] = {}
    else:
        loader = _yaml_loader(path, text)
        try:
            node = loader.get_single_node()
            values = loader.construct_document(node) if node is not None else None
            lines = _key_lines(node)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise SeqtrainError(f"--config {path}{where}: invalid YAML: {problem}") from None
        finally:
            loader.dispose()
        if values is None:
            values = {}
    if not isinstance(values, dict):
        raise SeqtrainError(f"--config {path}: expected a mapping of flag names to values")
    flat: dict[str, Any] = {}
    flat_lines: dict[str, int] = {}
    sections: dict[str, int] = {}
    _flatten(path, values, lines, flat, flat_lines, sections)
    return flat, flat_lines, sections


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
        elif action.type is int and isinstance(value, float):
            # int(3.7) would truncate; the command line refuses --seed 3.7, and so does a config
            raise ValueError("expected an integer")
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
        negatives = getattr(action, "negatives", ())
        for flag in [o for o in action.option_strings if o not in negatives]:
            out[flag.lstrip("-")] = action
            out[flag.lstrip("-").replace("-", "_")] = action
    return out


def config_values(parser: argparse.ArgumentParser, path: str, dests: Any) -> dict[str, Any]:
    """The values the config file `path` gives the flags of `parser` whose dest is in `dests`, converted and
    checked as apply_config converts them (by dest; a flag the file does not set is absent)."""
    values, lines, _ = load_config(path)
    by_key = actions_by_key(parser)
    out: dict[str, Any] = {}
    for key, value in values.items():
        action = by_key.get(key.lstrip("-")) or by_key.get(key.lstrip("-").replace("-", "_"))
        if action is not None and action.dest in dests:
            where = f"--config {path}" + (f" line {lines.get(key)}" if lines.get(key) else "") + f" ({key})"
            out[action.dest] = _convert(action, value, where)
    return out


def check_sections(path: str, sections: dict[str, int], *flags: dict[str, argparse.Action]) -> None:
    """Refuse a section (a mapping in the file, load_config's `sections`) named like one of `flags` (config
    keys, as actions_by_key makes them): `beam: {a: 1}` was read as `a: 1`, the beam lost."""
    for name, line in sections.items():
        key = name.lstrip("-")
        # long names only: a section may well be called `a` or `s` (fairseq's -a for --arch, -s for --source-lang)
        if len(key) > 1 and any(key in keys or key.replace("-", "_") in keys for keys in flags):
            where = f"--config {path}" + (f" line {line}" if line else "") + f" ({name})"
            raise SeqtrainError(
                f"{where}: {name!r} is a flag, and its value is a mapping; give the flag a value (a mapping is a "
                "section only under a name that is no flag)"
            )


def apply_config(
    parser: argparse.ArgumentParser,
    path: str,
    values: dict[str, Any],
    lines: dict[str, int],
    strict: bool = True,
    ignore: dict[str, argparse.Action] | None = None,
    sections: dict[str, int] | None = None,
) -> None:
    """Set config values as parser defaults. With strict, a key that is no flag of this parser is an error,
    unless it is a key of `ignore` (the flags of the other CLI: one config serves training and generation).
    A section (`sections`, load_config's) named like a flag of either is an error (check_sections)."""
    by_key = actions_by_key(parser)
    check_sections(path, sections or {}, by_key, ignore or {})
    defaults: dict[str, Any] = {}
    given: dict[str, str] = {}  # dest -> the key that set it
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
                close = difflib.get_close_matches(
                    key.lstrip("-"), [k for k in {**by_key, **(ignore or {})} if "_" not in k], n=1
                )
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise SeqtrainError(f"{where}: unknown option {key!r}{hint}")
            continue
        if action.dest in defaults:  # max-tokens and max_tokens: one flag, two values, the last won silently
            raise SeqtrainError(
                f"{where}: {key!r} and {given[action.dest]!r} name the same flag; give it once"
            )
        given[action.dest] = key
        defaults[action.dest] = _convert(action, value, where)
        if not action.option_strings:
            # A positional (DATA) given in the config becomes optional on the command line.
            action.nargs, action.required = "?", False
        elif action.required:
            action.required = False
    parser.set_defaults(**defaults)


def config_text(parser: argparse.ArgumentParser, args: argparse.Namespace, header: str = "") -> str:
    """The resolved flags of `args` as a YAML config file: read back with --config alone (and nothing on the
    command line), it gives the same flags. One `flag: value` line per flag, under a comment per help group."""
    import yaml  # PyYAML loads only when a --config file is given

    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    seen: set[str] = set()
    for group in parser._action_groups:
        body = []
        for action in group._group_actions:
            if action.dest in seen or action.dest in ("help", "config", "print_config"):
                continue
            if not hasattr(args, action.dest):
                continue
            seen.add(action.dest)
            value = getattr(args, action.dest)
            if value is None and action.default is None:
                continue
            key = action.option_strings[0].lstrip("-") if action.option_strings else action.dest
            longs = [o for o in action.option_strings if o.startswith("--")]
            if longs:
                key = longs[0][2:]
            if isinstance(value, list):  # one line: key: [a, b]
                body.append(
                    f"{key}: " + yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
                )
            else:
                body.append(
                    yaml.safe_dump({key: value}, default_flow_style=False, width=1 << 16).rstrip("\n")
                )
        if body:
            lines += [f"# ---- {group.title}", *body]
    return "\n".join(lines) + "\n"
