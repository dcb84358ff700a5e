"""seqtrain-train --store-ema end to end: the EMA resumes bitwise, --validate-with-ema validates (and picks
checkpoint_best) by the EMA weights without disturbing training, and seqtrain-convert --ema exports them."""

from __future__ import annotations

import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain_cli.convert import main as convert_main
from seqtrain_cli.train import train_main
from tests.utils import base_args, parse_log

pytestmark = pytest.mark.slow
EMA = ("--store-ema", "--ema-decay", "0.9", "--ema-update-freq", "3", "--no-epoch-checkpoints")


def last(save: str) -> dict:
    return load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def unbroken(databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ema_unbroken"))
    log = os.path.join(save, "train.log")
    assert (
        train_main(
            base_args(databin, save, *EMA, "--max-update", "10", "--log-format", "simple", "--log-file", log)
        )
        == 0
    )
    return save, log


def test_ema_is_saved_and_resumes_bitwise(databin, unbroken, tmp_path):
    full = last(unbroken[0])
    extra = full["extra_state"]
    assert extra["ema_counter"] == 10 % 3
    # the EMA moved away from the initial weights and is not the final weights
    k = "decoder.layers.0.fc1.weight"
    assert not torch.equal(extra["ema"][k], full["model"][k])
    save = str(tmp_path / "resumed")
    assert train_main(base_args(databin, save, *EMA, "--max-update", "5")) == 0  # stops mid-epoch, counter 2
    assert last(save)["extra_state"]["ema_counter"] == 2
    assert train_main(base_args(databin, save, *EMA, "--max-update", "10")) == 0
    again = last(save)
    assert same_tensors(again["model"], full["model"])
    assert (
        same_tensors(again["extra_state"]["ema"], extra["ema"]) and again["extra_state"]["ema_counter"] == 1
    )


def test_validate_with_ema_validates_by_the_ema_and_leaves_training_alone(databin, unbroken, tmp_path):
    save, log = str(tmp_path / "valid_ema"), str(tmp_path / "train.log")
    flags = (*EMA, "--validate-with-ema", "--max-update", "10", "--log-format", "simple", "--log-file", log)
    assert train_main(base_args(databin, save, *flags)) == 0
    ours, theirs = parse_log(log, "valid"), parse_log(unbroken[1], "valid")
    assert len(ours) == len(theirs) == 3 and all(a["loss"] != b["loss"] for a, b in zip(ours, theirs))
    assert same_tensors(last(save)["model"], last(unbroken[0])["model"])  # training itself is the same
    assert same_tensors(last(save)["extra_state"]["ema"], last(unbroken[0])["extra_state"]["ema"])


def test_convert_exports_the_ema_weights(unbroken, tmp_path):
    out = str(tmp_path / "ema.pt")
    convert_main([os.path.join(unbroken[0], "checkpoint_last.pt"), out, "--to", "seqtrain", "--ema"])
    exported = load_checkpoint_file(out)["model"]
    ema = last(unbroken[0])["extra_state"]["ema"]
    assert exported.keys() == ema.keys() and all(torch.equal(exported[k], ema[k]) for k in ema)


def test_ema_flags_need_store_ema(databin, tmp_path):
    with pytest.raises(SeqtrainError, match=r"^--validate-with-ema needs --store-ema"):
        train_main(base_args(databin, str(tmp_path / "x"), "--validate-with-ema", "--max-update", "1"))
