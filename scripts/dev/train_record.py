"""What short seqtrain-train runs leave for a user to see, as JSON: for each case (a command line) the `args` record
its last checkpoint stores (each value's repr), its config.yaml and its log lines (timestamps dropped, measured
figures masked: times, speeds, losses; the lines about the machine or the process left out: MACHINE_LINES).

tests/e2e/test_train_record.py runs the same cases and compares them, key by key and line by line, with
tests/e2e/train_record.json, which this script wrote from the code before training's settings were refactored
(issue 51: the refactor changes nothing a user sees). Run it with --write only for a change meant to alter what
a run records, and say so in the commit.

    .venv/bin/python scripts/dev/train_record.py                 # compare with the fixture, print differences
    .venv/bin/python scripts/dev/train_record.py --write         # rewrite the fixture
    .venv/bin/python scripts/dev/train_record.py --cases basic   # some cases only

Paths are written as <DATA>, <MONO>, <SAVE>, <TMP> and <REPO>. The cases take about a minute on 2 cores (the
two-rank case spawns its processes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "e2e" / "train_record.json"
PLUGIN = REPO / "tests" / "plugins" / "seqtrain_toy_plugin"

# Each case: its seqtrain-train flags after DATA (the data-bin: "<DATA>" pairs, "<MONO>" the monolingual one)
# and the save dir, and whether it runs again after the first launch (a resume, with "then" added).
BASE = ["--arch", "bart_tiny", "--cpu", "--lr", "3e-3", "--max-tokens", "512", "--seed", "3"]
CASES: dict[str, dict[str, Any]] = {
    "basic": {
        "flags": [*BASE, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5", "--max-update", "3"]
        + ["--log-interval", "1"],
    },
    # a --config preset (its generation keys skipped), other components, a layer kept, ROUGE validation, EMA
    "options": {
        "config": (
            "# a preset serves training and generation\n"
            "optimization:\n  lr-scheduler: cosine\n  warmup-updates: 1\n  warmup-init-lr: 1e-4\n  clip-norm: 0.5\n"
            "beam: 2\nmax-len-b: 6\n"
        ),
        "flags": [*BASE, "--optimizer", "nag", "--momentum", "0.9", "--criterion"]
        + ["label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--encoder-layers-to-keep", "0"]
        + ["--eval-rouge", "--eval-rouge-args", '{"beam": 2, "max_len_b": 6}', "--best-checkpoint-metric"]
        + ["rouge_l", "--maximize-best-checkpoint-metric", "--store-ema", "--update-freq", "2"]
        + ["--merge-max-tokens", "1024", "--batch-size", "16", "--max-update", "2", "--log-format", "json"]
        + ["--source-lang", "src", "--target-lang", "tgt", "--no-epoch-checkpoints"],
    },
    # --max-tokens auto (the device-memory probe answered by a stand-in: 5 rows fit), then resumed
    "auto": {
        "flags": [*BASE, "--max-tokens", "auto", "--max-update", "2", "--valid-subset", "valid"],
        "then": ["--max-update", "3"],
    },
    # a --user-dir arch and criterion
    "plugin": {
        "flags": [*BASE, "--user-dir", "<REPO>/tests/plugins/seqtrain_toy_plugin", "--arch", "toy_micro"]
        + ["--criterion", "toy_double_cross_entropy", "--max-update", "2", "--log-format", "simple"],
    },
    "denoising": {
        "data": "<MONO>",
        "flags": [*BASE, "--task", "denoising", "--tokens-per-sample", "32", "--mask", "0.3"]
        + ["--permute-sentences", "1.0", "--max-update", "2", "--optimizer", "adafactor"],
    },
    # two spawned ranks, DDP
    "ddp": {
        "flags": [*BASE, "--distributed-world-size", "2", "--ddp-backend", "c10d", "--max-update", "2"]
        + ["--batch-size", "8"],
    },
}


def make_data(folder: str) -> dict[str, str]:
    """A pair data-bin (<DATA>: 120 toy pairs, 24 for validation) and a monolingual one (<MONO>: its sources)."""
    from seqtrain_cli.preprocess import preprocess_main

    r = random.Random(0)
    raw = os.path.join(folder, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n in (("train", 120), ("valid", 24)):
        with open(f"{raw}/{split}.src", "w") as fs, open(f"{raw}/{split}.tgt", "w") as ft:
            for _ in range(n):
                toks = [f"w{r.randrange(30)}" for _ in range(r.randint(4, 9))]
                fs.write(" ".join(toks) + ".\n")
                ft.write(" ".join(reversed(toks[:4])) + "\n")
    common = ["--tokenizer", "none", "--no-progress-bar"]
    pairs, mono = os.path.join(folder, "bin"), os.path.join(folder, "mono")
    preprocess_main(
        [
            "-s",
            "src",
            "-t",
            "tgt",
            "--joined-dictionary",
            "--trainpref",
            f"{raw}/train",
            "--validpref",
            f"{raw}/valid",
        ]
        + ["--destdir", pairs, *common]
    )
    preprocess_main(
        [
            "--only-source",
            "--trainpref",
            f"{raw}/train.src",
            "--validpref",
            f"{raw}/valid.src",
            "--destdir",
            mono,
        ]
        + common
    )
    return {"<DATA>": pairs, "<MONO>": mono}


@contextlib.contextmanager
def five_rows_fit() -> Iterator[None]:
    """--max-tokens auto on the CPU: a batch fits with at most 5 rows (the probe asks CUDA otherwise)."""
    from seqtrain.train import auto_tokens

    saved = auto_tokens.probe_fits
    auto_tokens.probe_fits = lambda trainer, sample: sample["nsentences"] <= 5
    try:
        yield
    finally:
        auto_tokens.probe_fits = saved


# Lines that report on the machine or the process, not the run: the thread choice (the machine's load), the
# CPU decoding step (logged once a process, and only where the extension builds), rouge-score's first use.
MACHINE_LINES = ("intra-op thread", "CPU decoding", "| absl |")


def _masked_line(line: str) -> str | None:
    """A log line without its timestamp, its measured figures masked; None for a line of MACHINE_LINES."""
    text = line.rstrip("\n").split(" | ", 1)[-1]
    if any(m in text for m in MACHINE_LINES):
        return None
    text = re.sub(r"\b(train_wall|wall|wps|ups|loss|nll_loss|ppl|gnorm)([= ]|\": )[\d.e+-]+", r"\1\2N", text)
    text = re.sub(r"\d+\.\d+(e-?\d+)?", "F", text)
    return re.sub(r"\b\d+[hms]\b", "Ns", text)


def _plain(value: Any, paths: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, path in paths.items():
            value = value.replace(path, name)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v, paths) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v, paths) for k, v in value.items()}
    return value


def run_case(name: str, data: dict[str, str], tmp: str) -> dict[str, Any]:
    """Run case `name` on the data-bins `data` (make_data's) in folder `tmp`; its record, config and log."""
    import torch

    from seqtrain_cli.train import train_main

    case = CASES[name]
    os.makedirs(tmp, exist_ok=True)
    save = os.path.join(tmp, name)
    log = os.path.join(tmp, f"{name}.log")
    paths = {**data, "<SAVE>": save, "<REPO>": str(REPO)}
    paths = dict(sorted(paths.items(), key=lambda kv: -len(kv[1])))  # the longest path first
    flags = [f.replace("<REPO>", str(REPO)) for f in case["flags"]]
    argv = [data[case.get("data", "<DATA>")], *flags, "--save-dir", save, "--log-file", log]
    if "config" in case:
        config = os.path.join(tmp, f"{name}.yaml")
        with open(config, "w") as f:
            f.write(case["config"])
        argv += ["--config", config]
    paths["<TMP>"] = tmp
    with five_rows_fit() if name == "auto" else contextlib.nullcontext():
        assert train_main(argv) == 0, name
        if "then" in case:
            assert train_main(argv + case["then"]) == 0, name
    stored = torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=False)["args"]
    with open(os.path.join(save, "config.yaml"), encoding="utf-8") as f:
        config_yaml = _plain(f.read(), paths)
    with open(log, encoding="utf-8") as f:
        lines = [m for m in (_masked_line(_plain(line, paths)) for line in f) if m is not None]
    return {
        "args": {k: repr(_plain(v, paths)) for k, v in stored.items()},
        "config_yaml": config_yaml,
        "log": lines,
    }


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs between two cases' records, one line each (empty: the same)."""
    out = []
    for key in sorted(set(want["args"]) | set(got["args"])):
        a, b = want["args"].get(key, "(absent)"), got["args"].get(key, "(absent)")
        if a != b:
            out.append(f"args[{key!r}]: {a} -> {b}")
    if list(want["args"]) != list(got["args"]) and not out:
        out.append("args: the same keys and values in another order")
    if want["config_yaml"] != got["config_yaml"]:
        out.append(
            "config.yaml differs:\n"
            + _diff(want["config_yaml"].splitlines(), got["config_yaml"].splitlines())
        )
    if want["log"] != got["log"]:
        out.append("log lines differ:\n" + _diff(want["log"], got["log"]))
    return out


def _diff(a: list[str], b: list[str]) -> str:
    import difflib

    return "\n".join(difflib.unified_diff(a, b, "before", "now", lineterm="", n=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {FIXTURE.relative_to(REPO)}")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(os.path.join(tmp, "data"))
        got = {name: run_case(name, data, os.path.join(tmp, "runs")) for name in names}
    if args.write:
        old = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
        FIXTURE.write_text(json.dumps({**old, **got}, indent=1) + "\n")
        print(f"wrote {FIXTURE.relative_to(REPO)} ({', '.join(names)})")
        return 0
    want = json.loads(FIXTURE.read_text())
    bad = 0
    for name in names:
        diff = differences(want[name], got[name])
        print(f"{name}: {'the same' if not diff else 'DIFFERENT'}")
        for line in diff:
            print(f"  {line}")
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
