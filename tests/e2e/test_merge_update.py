"""seqtrain-train --merge-max-tokens: the training loop runs each update's --update-freq batches as one pass and
trains as accumulation does (dropout 0: the same logged losses and sample sizes, the same weights up to fp32
summation order); refused where ranks could run different numbers of passes (FSDP)."""

from __future__ import annotations

import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, training
from seqtrain.train.loop import check_settings
from seqtrain.train.program import train_config
from seqtrain_cli.train import train_main
from tests.utils import FP32, base_args

FLAGS = ["--dropout", "0", "--attention-dropout", "0", "--update-freq", "2", "--max-update", "4"]
FLAGS += ["--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1"]


def inner_stats(path: str) -> list[dict[str, float]]:
    """The key=value figures of each train_inner line of a simple-format log."""
    out = []
    for line in open(path, encoding="utf-8"):
        if " | train_inner | " in line:
            pairs = (p.split("=") for p in line.split(" | ")[-1].split(", ") if "=" in p)
            out.append({k.split()[-1]: float(v) for k, v in pairs})
    return out


@pytest.mark.slow
def test_training_with_merged_updates_equals_accumulation(databin, tmp_path):
    runs = {}
    for name, extra in (("accumulated", []), ("merged", ["--merge-max-tokens", "4096"])):
        save_dir = str(tmp_path / name)
        log = str(tmp_path / f"{name}.log")
        train_main(base_args(databin, save_dir, *FLAGS, *extra, "--log-file", log))
        runs[name] = (
            load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt")),
            inner_stats(log),
        )
    (a, log_a), (b, log_b) = runs["accumulated"], runs["merged"]
    merged_log = open(tmp_path / "merged.log", encoding="utf-8").read()
    for epoch in (1, 2):  # 4 batches an epoch, 2 an update: one pass each
        assert f"--merge-max-tokens: 4 batches of epoch {epoch} ran as 2 passes" in merged_log
    assert "--merge-max-tokens" not in open(tmp_path / "accumulated.log", encoding="utf-8").read()
    assert b["extra_state"]["num_updates"] == a["extra_state"]["num_updates"] == 4
    assert len(log_a) == len(log_b) == 4
    for la, lb in zip(log_a, log_b, strict=True):
        assert (la["wpb"], la["bsz"]) == (lb["wpb"], lb["bsz"])  # the same examples in each update
        assert lb["loss"] == pytest.approx(la["loss"], abs=1.5e-3)  # as logged (3 decimals)
    changed = 0
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, **FP32, msg=k)  # 4 Adam updates
        changed += not torch.equal(b["model"][k], v)
    assert changed  # another summation order: not bit for bit, so the merge did run


def test_merge_is_refused_with_fsdp(databin, tmp_path):
    argv = base_args(databin, str(tmp_path), "--merge-max-tokens", "4096", "--update-freq", "2")
    argv += ["--ddp-backend", "fully_sharded", "--distributed-world-size", "2"]
    args = parsing.parse_args_and_arch(training.get_training_parser(), argv)
    with pytest.raises(
        SeqtrainError, match="--merge-max-tokens is not supported with --ddp-backend fully_sharded"
    ):
        check_settings(train_config(args))
