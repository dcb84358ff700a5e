"""seqtrain-tune's flags (seqtrain.generation.tune does the search): which settings to search, their candidates
(--tune-grid, checked value by value against the generation flags' kinds and ranges), the metric, the sample, the
search and the output folder. Declared as TuneConfig, which add_tune_args (seqtrain.generation.options.get_tune_parser)
adds to seqtrain-generate's parser."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from seqtrain.config import add_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.generation.search import GenerationConfig, check_generation_args, check_generation_value

# --tune's names (the flags') -> (flag dest, candidates tried when --tune-grid names none). The given value of a
# setting is always among its candidates, so the best is never below the given settings on the sample.
TUNABLE: dict[str, tuple[str, tuple[int | float, ...]]] = {
    "beam": ("beam", (2, 4, 5, 8)),
    "lenpen": ("lenpen", (0.6, 1.0, 1.5, 2.0)),
    "min-len": ("min_len", (1, 5, 10, 20)),
    "max-len-b": ("max_len_b", (50, 100, 200)),
    "no-repeat-ngram-size": ("no_repeat_ngram_size", (0, 3, 4)),
}
METRICS = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_l": "rougeL", "rouge_lsum": "rougeLsum"}


def _settings(text: str) -> list[str]:
    """--tune's value: tunable setting names, comma-separated."""
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if n not in TUNABLE:
            raise argparse.ArgumentTypeError(f"unknown setting {n!r} (tunable: {', '.join(TUNABLE)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a setting is named twice in {text!r}")
    return names


def _grid(text: str) -> dict[str, list[int | float]]:
    """--tune-grid's value: 'SETTING=V1,V2,...;SETTING=...', each value of its flag's kind and range."""
    out: dict[str, list[int | float]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, eq, values = part.partition("=")
        name = name.strip()
        if not eq or not values.strip():
            raise argparse.ArgumentTypeError(
                f"{part!r} is not SETTING=V1,V2,... (e.g. 'lenpen=0.6,1.0,2.0;beam=2,4')"
            )
        if name not in TUNABLE:
            raise argparse.ArgumentTypeError(f"unknown setting {name!r} (tunable: {', '.join(TUNABLE)})")
        if name in out:
            raise argparse.ArgumentTypeError(f"{name} is given twice")
        dest = TUNABLE[name][0]
        kind = type(TUNABLE[name][1][0])
        parsed: list[int | float] = []
        for v in (v.strip() for v in values.split(",")):
            try:
                value = kind(v)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise argparse.ArgumentTypeError(f"{name}={v!r}: must be {what}") from None
            try:
                check_generation_value(dest, value)
                check_generation_args(_one(dest, value))
            except SeqtrainError as e:
                raise argparse.ArgumentTypeError(f"{name}={v}: {e}") from None
            if value not in parsed:
                parsed.append(value)
        out[name] = parsed
    if not out:
        raise argparse.ArgumentTypeError("empty; give e.g. 'lenpen=0.6,1.0,2.0;beam=2,4'")
    return out


def _one(dest: str, value: Any) -> GenerationConfig:
    """seqtrain-generate's default settings with one changed, for the range checks of a single value (min-len
    against max-len-b is checked per combination, in the search)."""
    base = GenerationConfig()
    changed = {dest: value}
    if dest == "min_len":
        changed["max_len_b"] = max(base.max_len_b, int(value))
    if dest == "max_len_b":
        changed["min_len"] = min(base.min_len, int(value))
    return dataclasses.replace(base, **changed)


_DEFAULT_GRID = "; ".join(f"{n}={','.join(map(str, v))}" for n, (_, v) in TUNABLE.items())


@settings
class TuneConfig:
    """Tuning"""

    tune: list[str] = setting(
        list(TUNABLE),
        f"the settings to search, comma-separated, among: {', '.join(TUNABLE)} (default: all)",
        type=_settings,
        metavar="SETTING,...",
    )
    tune_grid: dict[str, list[int | float]] | None = setting(
        None,
        "candidate values of settings, e.g. 'lenpen=0.6,1.0,2.0;beam=2,4' (the given value is always "
        f"tried too); settings it does not name try: {_DEFAULT_GRID}",
        type=_grid,
        metavar="GRID",
    )
    tune_metric: str = setting(
        "rouge_lsum",
        "the ROUGE F1 the search maximizes (default: rouge_lsum)",
        choices=list(METRICS),
    )
    tune_subset: int = setting(
        100,
        "search on N examples of the split, a sample drawn with --seed (all of them when it has fewer); "
        "the given and the best settings are then compared on the whole split",
        type=int,
        metavar="N",
    )
    tune_search: str = setting(
        "coordinate",
        "coordinate: one setting at a time over its candidates, the others at the best so far, passes until "
        "one changes nothing; grid: every combination (default: coordinate)",
        choices=["coordinate", "grid"],
    )
    tune_bootstrap: int = setting(
        1000,
        "resamples of the bootstrap intervals and of the paired test (default: 1000)",
        type=int,
        metavar="N",
    )
    tune_output: str | None = setting(
        None,
        "write generation.yaml (a --config preset), generation_config.json and tune.json here",
        metavar="DIR",
        required=True,
    )
    tune_checkpoint: str | None = setting(
        None,
        "also write the --path checkpoint with the chosen settings stored in it to FILE (a seqtrain checkpoint, "
        "weights and training state as they are; FILE may be --path itself, replaced atomically): "
        "seqtrain-generate, -interactive and Summarizer then decode with them unless given other flags",
        metavar="FILE",
    )


def add_tune_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """seqtrain-tune's own flags (on top of seqtrain-generate's), in one group."""
    g = add_settings(parser, TuneConfig, "Tuning")
    parser.set_defaults(gen_subset="valid")
    return g
