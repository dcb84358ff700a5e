"""Helpers shared by the test modules: paths, the toy data-bin builder, seqtrain-train arguments and log parsing,
and loading a script of scripts/ that a test checks. Not a test file; import it as `tests.utils`."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import random
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "debdesc-sample"
SHARED = REPO.parent / "shared"
FAIRSEQ_TINY = SHARED / "fixtures" / "fairseq-tiny"

# fp32 results of two code paths that sum in different orders (packed against padded attention, incremental
# against full decoding, transformers or fairseq against seqtrain). The CPU's kernels block their sums by the
# vector width (AVX2, AVX-512, AMX), so a bound met to the last ulp on one x86 CPU fails on another: compare
# with torch's own fp32 defaults, relative and absolute, never `rtol=0` at 1e-6 (issue 40: an AVX2-only EPYC
# gave 1.19e-6 and 1.31e-6 where an AMX Xeon stayed under 1e-6). Bitwise claims (the same kernels on both sides)
# keep atol=0, rtol=0.
FP32 = {"rtol": 1.3e-6, "atol": 1e-5}


def make_toy_databin(folder, n_train: int = 200, n_valid: int = 40, seed: int = 0) -> str:
    """A data-bin for a learnable toy task: the target is the first 4 source words, reversed (words w0..w29,
    4 to 9 of them a sentence). Returns the data-bin folder (`folder`/bin)."""
    from seqtrain_cli.preprocess import preprocess_main as preprocess

    r = random.Random(seed)
    raw = os.path.join(str(folder), "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        with open(f"{raw}/{split}.src", "w") as fs, open(f"{raw}/{split}.tgt", "w") as ft:
            for _ in range(n):
                toks = [f"w{r.randrange(30)}" for _ in range(r.randint(4, 9))]
                fs.write(" ".join(toks) + "\n")
                ft.write(" ".join(reversed(toks[:4])) + "\n")
    dest = os.path.join(str(folder), "bin")
    preprocess(
        [
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--trainpref",
            f"{raw}/train",
            "--validpref",
            f"{raw}/valid",
            "--destdir",
            dest,
            "--joined-dictionary",
            "--tokenizer",
            "none",
            "--no-progress-bar",
        ]
    )
    return dest


def base_args(data: str, save_dir: str, *extra: str) -> list:
    """seqtrain-train arguments for bart_tiny on the toy data-bin, on CPU, without logging."""
    return [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
        "--lr",
        "3e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "5",
        "--max-tokens",
        "512",
        "--log-format",
        "none",
        "--save-dir",
        save_dir,
        "--seed",
        "3",
        *extra,
    ]


def parse_log(path: str, tag: str) -> list:
    """The ' | key value' stats of the `tag` lines of a simple-format log."""
    out = []
    for line in open(path, encoding="utf-8"):
        parts = line.rstrip("\n").split(" | ")
        if len(parts) > 3 and parts[2] == tag:
            stats = {}
            for p in parts[3:]:
                key, _, value = p.partition(" ")
                try:
                    stats[key] = float(value)
                except ValueError:
                    pass
            out.append(stats)
    return out


def load_script(name: str) -> ModuleType:
    """scripts/`name`.py as a module, for the tests that check that script (scripts/ is not a package and is not
    put on sys.path)."""
    path = REPO / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location("scripts_" + name.replace("/", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up here
    spec.loader.exec_module(module)
    return module


def script_output(name: str, args: list[str], timeout: int) -> str:
    """Run scripts/`name`.py with `args`; it must exit 0. Returns what it printed."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def script_table_rows(name: str, args: list[str], row: str, timeout: int) -> list[tuple[str, ...]]:
    """Run scripts/`name`.py with `args` (it must exit 0) and return the groups of each line of its printed
    table that matches the regular expression `row` (a benchmark's figures are printed, not asserted)."""
    return re.findall(row, script_output(name, args, timeout), re.M)


def assert_same_state(a: dict, b: dict) -> None:
    """Two seqtrain checkpoints hold bitwise the same training state: model, optimizer state, lr scheduler,
    update count, epoch, data position and best value."""
    import torch

    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for pid, sa in a["optimizer"]["state"].items():
        sb = b["optimizer"]["state"][pid]
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), (pid, k)
    assert a["lr_scheduler"] == b["lr_scheduler"]
    for k in ("num_updates", "epoch", "train_iterator", "best"):
        assert a["extra_state"][k] == b["extra_state"][k], k


def optimizer_of(args: Any, params: Any) -> Any:
    """The optimizer of parsed flags, as seqtrain-train builds it: its settings read once, then the builder."""
    from seqtrain.optim import build_optimizer
    from seqtrain.train.program import train_config

    return build_optimizer(train_config(args).optimizer, params)


def scheduler_of(args: Any, optimizer: Any) -> Any:
    """The lr scheduler of parsed flags, as seqtrain-train builds it."""
    from seqtrain.optim import build_lr_scheduler
    from seqtrain.train.program import train_config

    return build_lr_scheduler(train_config(args).lr_scheduler, optimizer)


def completed(args: Any) -> Any:
    """A hand-made checkpoint record (`argparse.Namespace(arch="bart_tiny", ...)`) completed as a loaded one is
    (seqtrain.checkpoint.fairseq.complete_model_fields: the arch preset's sizes filled in): the record tests
    save or export beside a model built from it. Returns it."""
    from seqtrain.checkpoint.fairseq import complete_model_fields

    complete_model_fields(args)
    return args
