"""Adapters-only LoRA checkpoints (--save-adapters-only): the file holds the adapters and no base weight; it
generates what the full LoRA checkpoint and the merged export do, resumes exactly, and refuses a missing or
different base in one line."""

from __future__ import annotations

import io
import os
import shutil

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.generation.generate import generate
from seqtrain.generation.options import parse_generation_args
from seqtrain.generation.summarizer import Summarizer
from seqtrain_cli.convert import main as convert_main
from seqtrain_cli.train import train_main
from tests.utils import base_args

pytestmark = pytest.mark.slow

LORA = ("--lora-rank", "4", "--lora-modules", "q_proj,v_proj,fc1", "--lr", "1e-2", "--no-epoch-checkpoints")


@pytest.fixture(scope="module")
def runs(toy_databin, tmp_path_factory):
    """A pretrained base; from it the same LoRA run twice, once saving everything, once adapters only."""
    data = toy_databin()
    root = tmp_path_factory.mktemp("lora_adapters")
    start = str(root / "start")
    assert train_main(base_args(data, start, "--max-update", "2", "--no-epoch-checkpoints")) == 0
    base = os.path.join(start, "checkpoint_last.pt")
    ffm = ("--finetune-from-model", base, *LORA, "--max-update", "6")
    full, small = str(root / "full"), str(root / "small")
    assert train_main(base_args(data, full, *ffm)) == 0
    assert train_main(base_args(data, small, *ffm, "--save-adapters-only")) == 0
    return {
        "data": data,
        "base": base,
        "full": os.path.join(full, "checkpoint_last.pt"),
        "small": os.path.join(small, "checkpoint_last.pt"),
    }


def hypotheses(data: str, path: str, *extra: str) -> list[str]:
    argv = [
        data,
        "--path",
        path,
        "--gen-subset",
        "valid",
        "--beam",
        "3",
        "--cpu",
        "--batch-size",
        "8",
        *extra,
    ]
    return [
        line for line in generate(parse_generation_args(argv), out=io.StringIO())["lines"] if line[0] in "HP"
    ]


def test_the_file_holds_only_the_adapters(runs):
    full, small = load_checkpoint_file(runs["full"]), load_checkpoint_file(runs["small"])
    adapters = {k: v for k, v in full["model"].items() if k.endswith((".lora_A", ".lora_B"))}
    assert sorted(small["model"]) == sorted(adapters) and adapters
    assert all(torch.equal(small["model"][k], v) for k, v in adapters.items())  # the same run, bitwise
    nbytes = sum(v.numel() * v.element_size() for v in small["model"].values())
    assert nbytes == sum(v.numel() * v.element_size() for v in adapters.values())
    full_bytes = sum(v.numel() * v.element_size() for v in full["model"].values())
    assert nbytes * 20 < full_bytes and os.path.getsize(runs["small"]) * 4 < os.path.getsize(runs["full"])
    assert (
        small["lora_base"]["path"] == os.path.abspath(runs["base"])
        and len(small["lora_base"]["sha256"]) == 64
    )
    assert len(small["optimizer"]["state"]) == len(adapters)  # a resume continues the adapters' Adam moments


def test_adapters_generate_as_the_full_checkpoint_and_the_merged_exports(runs, tmp_path):
    merged, fq = str(tmp_path / "merged.pt"), str(tmp_path / "fairseq" / "model.pt")
    convert_main([runs["small"], merged, "--to", "seqtrain"])
    convert_main([runs["small"], fq, "--to", "fairseq"])
    plain = load_checkpoint_file(merged)
    assert not [k for k in plain["model"] if "lora_" in k] and "lora_base" not in plain
    small = hypotheses(runs["data"], runs["small"])
    assert small and small == hypotheses(runs["data"], runs["full"]) == hypotheses(runs["data"], merged)
    assert small == hypotheses(runs["data"], fq)
    assert small != hypotheses(runs["data"], runs["base"])  # the adapters changed what the model says
    text = ["the cat sat on the mat and the dog lay down beside it"]
    want = Summarizer.from_pretrained(runs["full"]).summarize(text, beam=2)
    assert Summarizer.from_pretrained(runs["small"]).summarize(text, beam=2) == want


def test_resume_from_adapters_only_equals_an_unbroken_run(runs, tmp_path):
    save = str(tmp_path / "resumed")
    ffm = ("--finetune-from-model", runs["base"], *LORA, "--save-adapters-only")
    assert train_main(base_args(runs["data"], save, *ffm, "--max-update", "3")) == 0
    assert train_main(base_args(runs["data"], save, *ffm, "--max-update", "6")) == 0
    resumed, unbroken = (
        load_checkpoint_file(os.path.join(save, "checkpoint_last.pt")),
        load_checkpoint_file(runs["small"]),
    )
    assert resumed["extra_state"]["num_updates"] == unbroken["extra_state"]["num_updates"] == 6
    assert sorted(resumed["model"]) == sorted(unbroken["model"])
    for k, v in unbroken["model"].items():
        assert torch.equal(resumed["model"][k], v), k
    assert resumed["lora_base"] == unbroken["lora_base"]


def test_a_missing_or_different_base_is_one_line(runs, tmp_path):
    moved = str(tmp_path / "adapters.pt")
    shutil.copy(runs["small"], moved)
    obj = load_checkpoint_file(moved)
    obj["lora_base"] = {**obj["lora_base"], "path": str(tmp_path / "gone" / "model.pt")}
    save_checkpoint_file(obj, moved)
    with pytest.raises(
        SeqtrainError,
        match=r"holds LoRA adapters only and its base model .*gone/model.pt is not "
        r"found: give the base \(model.pt, sha256 [0-9a-f]{16}\.\.\.\) with --lora-base PATH",
    ):
        hypotheses(runs["data"], moved)
    other = load_checkpoint_file(runs["base"])
    other["model"]["encoder.layers.0.fc1.bias"] = other["model"]["encoder.layers.0.fc1.bias"] + 1e-3
    wrong = str(tmp_path / "other.pt")
    save_checkpoint_file(other, wrong)
    with pytest.raises(SeqtrainError) as e:
        hypotheses(runs["data"], moved, "--lora-base", wrong)
    msg = str(e.value)
    assert "\n" not in msg and f"but {wrong} has" in msg and msg.endswith("with --lora-base PATH")
    # the right base, given where it now is, works
    assert hypotheses(runs["data"], moved, "--lora-base", runs["base"]) == hypotheses(
        runs["data"], runs["small"]
    )


def test_adapters_only_needs_lora_and_a_base_file(toy_databin, tmp_path):
    data = toy_databin()
    with pytest.raises(SeqtrainError, match="--save-adapters-only needs --lora-rank"):
        train_main(base_args(data, str(tmp_path / "a"), "--save-adapters-only", "--max-update", "1"))
    with pytest.raises(SeqtrainError, match="start from one with --finetune-from-model PATH"):
        train_main(
            base_args(
                data, str(tmp_path / "b"), "--lora-rank", "4", "--save-adapters-only", "--max-update", "1"
            )
        )
