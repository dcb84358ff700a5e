"""seqtrain-preprocess --jsonl: JSON lines input (`{"document": ..., "summary": ...}` per line, as Hugging Face
dataset exports have them) instead of aligned line files.

Each split's PREFIX.jsonl is streamed once: every line must be a JSON object whose --source-key (and --target-key)
value is a non-empty string; any other line is an error naming the file and line. The values are written as the
aligned line files PREFIX.SRC / PREFIX.TGT into the run's temporary folder (line breaks inside a value become
spaces: one example per line), and the rest of preprocessing runs on those exactly as on line files, so a JSON
lines input gives byte for byte the data-bin of the equivalent line files, for any --workers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import JSONBoundsError, bounded_lines, decode_line, loads_bounded
from seqtrain.preprocess.options import PreprocessConfig

_LINE_BREAKS = re.compile(r"\r\n|[\r\n]")


def keys(cfg: PreprocessConfig, langs: list[str]) -> dict[str, str]:
    """lang -> the JSON key holding its text."""
    src, tgt = langs[0], langs[1:]  # the source side first (seqtrain.preprocess.databin.languages)
    out = {src: cfg.source_key or src}
    out.update({lang: cfg.target_key or lang for lang in tgt})
    return out


def _value(path: str, n: int, obj: Any, key: str) -> str:
    if key not in obj:
        shown = ", ".join(repr(k) for k in list(obj)[:8])
        raise SeqtrainError(
            f"{path}:{n}: no key {key!r} (the object has {shown or 'no keys'}; choose with --source-key / "
            "--target-key)"
        )
    value = obj[key]
    if not isinstance(value, str):
        raise SeqtrainError(f"{path}:{n}: {key!r} is {type(value).__name__}, expected a string")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which are no text and no UTF-8 can hold
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SeqtrainError(
            f"{path}:{n}: {key!r} holds a lone surrogate (\\u{ord(value[e.start]):04x} at character {e.start + 1}), "
            "which is no text: a UTF-16 surrogate must come in a pair"
        ) from None
    if not value.strip():
        raise SeqtrainError(
            f"{path}:{n}: {key!r} is empty (every example needs text; remove the line or filter it out)"
        )
    return _LINE_BREAKS.sub(" ", value)


def extract(path: str, lang_keys: dict[str, str], out_paths: dict[str, str]) -> int:
    """Stream `path` and write each lang's values, one per line, to out_paths[lang]; returns the number of
    examples. Raises SeqtrainError naming file:line on invalid UTF-8, invalid JSON (also nested deeper than
    seqtrain.fileio.MAX_NESTING or with a 100-digit integer), a line that is no object, a missing key, a
    non-string or an empty value."""
    outs = {lang: open(out_paths[lang], "w", encoding="utf-8", newline="\n") for lang in lang_keys}
    n = 0
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(bounded_lines(f, path), 1):
                line = decode_line(raw, path, n)
                if not line.strip():
                    raise SeqtrainError(f"{path}:{n}: empty line (expected one JSON object per line)")
                try:
                    obj = loads_bounded(line)
                except JSONBoundsError as e:  # deep nesting: json.loads would end in a RecursionError
                    raise SeqtrainError(f"{path}:{n}: {e.msg}") from None
                except ValueError as e:
                    raise SeqtrainError(f"{path}:{n}: invalid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise SeqtrainError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
                for lang, key in lang_keys.items():
                    outs[lang].write(_value(path, n, obj, key) + "\n")
    finally:
        for out in outs.values():
            out.close()
    if n == 0:
        raise SeqtrainError(f"{path}: file is empty")
    return n


FORMATS = {"jsonl": "--jsonl", "parquet": "--parquet", "load_from_disk": "--load-from-disk"}


def input_format(cfg: PreprocessConfig) -> str | None:
    """The structured input format chosen (jsonl, parquet, load_from_disk), None for line files; more than one
    flag is an error."""
    chosen = [fmt for fmt in FORMATS if getattr(cfg, fmt)]
    if len(chosen) > 1:
        raise SeqtrainError(f"{' and '.join(FORMATS[f] for f in chosen)}: choose one input format")
    return chosen[0] if chosen else None


def extract_splits(
    cfg: PreprocessConfig,
    splits: list[Any],
    langs: list[str],
    work: str,
    read: Callable[[str, dict[str, str], dict[str, str]], int] = extract,
) -> None:
    """Turn every split's PREFIX.jsonl into line files in `work`, and point the split at them. `read`: another
    reader with extract's signature (seqtrain.preprocess.tables: parquet files, save_to_disk folders)."""
    folder = os.path.join(work, "jsonl-text")  # a folder: publish() moves only the files of `work`
    os.makedirs(folder, exist_ok=True)
    lang_keys = keys(cfg, langs)
    for s in splits:
        out_paths = {lang: os.path.join(folder, f"{s.name}.{lang}") for lang in langs}
        s.n_lines = read(s.jsonl_path, lang_keys, out_paths)
        s.paths = out_paths
