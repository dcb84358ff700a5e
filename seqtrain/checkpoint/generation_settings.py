"""The generation settings a seqtrain checkpoint remembers: how the model is meant to be decoded (beam, lenpen,
min/max length, n-gram blocking), as transformers keeps a `generation_config.json` beside the weights.

A training run stores the generation keys of its `--config` preset; `seqtrain-tune --tune-checkpoint` stores
the settings it chose. They live under the checkpoint's own top-level key, `generation` (the `args` record is
left exactly as it was):

    {"settings": {"beam": 4, "max_len_b": 30, "no_repeat_ngram_size": 3},
     "sources": {"beam": "the training --config configs/debdesc_small.yaml", ...}}

`settings` holds seqtrain-generate's flag dests (GENERATION_DEFAULTS' keys), only those the source set;
`sources` says where each came from, for the logs of the programs that use them (seqtrain-generate,
-interactive, -tune and `Summarizer` take them as defaults under the user's own flags; seqtrain-convert writes
them into the exports). A checkpoint without the key (older seqtrain files, fairseq's, a run without a preset)
decodes exactly as before: with seqtrain-generate's defaults.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from typing import Any

from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.hf_files import GENERATION_DEFAULTS
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value

KEY = "generation"
STORED = tuple(GENERATION_DEFAULTS)  # beam, lenpen, max_len_a, max_len_b, min_len, no_repeat_ngram_size


@dataclass(frozen=True)
class StoredGeneration:
    """Generation settings a checkpoint carries: flag dest -> value, and flag dest -> where it came from."""

    settings: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The checkpoint's `generation` entry (plain data: weights_only loading reads it)."""
        return {"settings": dict(self.settings), "sources": dict(self.sources)}

    def describe(self) -> str:
        """'--beam 4, --max-len-b 30 (the training --config x.yaml); --lenpen 1.5 (seqtrain-tune ...)'."""
        by_source: dict[str, list[str]] = {}
        for dest, value in self.settings.items():
            by_source.setdefault(self.sources.get(dest, "?"), []).append(f"{flag(dest)} {value}")
        return "; ".join(f"{', '.join(flags)} ({source})" for source, flags in by_source.items())


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_setting(dest: str, value: Any, where: str) -> Any:
    """One stored setting, checked and converted as the command line would (the type of seqtrain-generate's
    default, the flag's range); `where` names the file and key in the error."""
    if dest not in GENERATION_DEFAULTS:
        raise SeqtrainError(f"{where}: {dest!r} is not a stored generation setting ({', '.join(STORED)})")
    kind = type(GENERATION_DEFAULTS[dest])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SeqtrainError(f"{where}: {dest} must be a number, got {value!r}")
    if kind is int and (isinstance(value, float) and not value.is_integer()):
        raise SeqtrainError(f"{where}: {dest} must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise SeqtrainError(f"{where}: {dest} must be finite, got {value!r}")
    value = kind(value)
    try:
        check_value(dest, value)
    except argparse.ArgumentTypeError as e:
        raise SeqtrainError(f"{where}: {dest} {value!r} is out of range for {flag(dest)} ({e})") from None
    return value


def make_stored(settings: dict[str, Any], source: str | dict[str, str], where: str) -> StoredGeneration:
    """StoredGeneration of `settings` (dest -> value; other keys are an error), each checked; `source`: one
    origin for all, or one per dest."""
    checked = {dest: check_setting(dest, v, f"{where} ({dest})") for dest, v in settings.items()}
    sources = {d: source for d in checked} if isinstance(source, str) else {d: source[d] for d in checked}
    return StoredGeneration(checked, sources)


def read_stored(obj: Any, path: str) -> StoredGeneration | None:
    """The generation settings a loaded checkpoint dict carries (None without them: fairseq checkpoints,
    older seqtrain ones), checked; a malformed entry is an error naming the file."""
    if not isinstance(obj, dict) or obj.get(KEY) is None:
        return None
    entry = obj[KEY]
    where = f"{path}: stored generation settings"
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
        raise SeqtrainError(
            f"{where}: expected {{'settings': {{...}}, 'sources': {{...}}}}, got {entry!r:.80}"
        )
    sources = entry.get("sources") or {}
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise SeqtrainError(f"{where}: 'sources' must map each setting to a text")
    settings = {str(k): v for k, v in entry["settings"].items()}
    stored = make_stored(settings, {d: sources.get(d, "stored in the checkpoint") for d in settings}, where)
    return stored if stored.settings else None


def with_stored(state: dict[str, Any], stored: StoredGeneration | None) -> dict[str, Any]:
    """A seqtrain checkpoint dict with its `generation` entry set to `stored` (removed for None/empty)."""
    out = {k: v for k, v in state.items() if k != KEY}
    if stored is not None and stored.settings:
        out[KEY] = stored.record()
    return out


def not_seqtrain(path: str) -> str:
    return (
        f"{path} is not a seqtrain checkpoint; only those store generation settings (convert it first: "
        f"seqtrain-convert {path} model.pt --to seqtrain)"
    )


def store_settings(
    path: str,
    output: str,
    settings: dict[str, Any],
    chosen: Any,
    source: str,
    other: str,
    unsafe: bool = False,
) -> StoredGeneration:
    """Write `output` (may be `path` itself: replaced atomically, a hard link to the old file keeps the old
    content): the seqtrain checkpoint `path` whole (weights, training state), with `settings` stored over the
    ones it carried; those whose dest is in `chosen` come from `source`, the others keep the origin the file gave
    them when it stored the same value, else `other`. Returns the settings stored."""
    obj = load_checkpoint_file(path, unsafe=unsafe)
    if not isinstance(obj, dict) or obj.get("format") != "seqtrain":
        raise SeqtrainError(not_seqtrain(path))
    old = read_stored(obj, path) or StoredGeneration()
    kept = {d: src for d, src in old.sources.items() if old.settings.get(d) == settings.get(d)}
    sources = {d: source if d in chosen else kept.get(d, other) for d in settings}
    new = make_stored(settings, sources, output)
    merged = StoredGeneration({**old.settings, **new.settings}, {**old.sources, **new.sources})
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    save_checkpoint_file(with_stored(obj, merged), output)
    return new
