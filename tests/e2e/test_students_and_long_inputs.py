"""Fine-tuning a smaller student (--decoder-layers-to-keep) from a deeper checkpoint, resumed as itself, and inputs
longer than the checkpoint's positions (--max-source-positions above it) in training and generation."""

from __future__ import annotations

import io
import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.generation.generate import generate
from seqtrain.generation.options import parse_generation_args
from seqtrain_cli.train import train_main
from tests.utils import base_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def teacher(databin, tmp_path_factory):
    """A bart_tiny with 4 decoder layers and 32 source positions, trained 4 updates on the toy data."""
    save = str(tmp_path_factory.mktemp("teacher"))
    extra = (
        "--decoder-layers",
        "4",
        "--max-source-positions",
        "32",
        "--max-update",
        "4",
        "--no-epoch-checkpoints",
    )
    assert train_main(base_args(databin, save, *extra)) == 0
    return os.path.join(save, "checkpoint_last.pt")


def test_a_student_starts_from_the_teachers_kept_layers_and_resumes_as_itself(databin, teacher, tmp_path):
    save = str(tmp_path / "student")
    flags = (
        "--finetune-from-model",
        teacher,
        "--decoder-layers-to-keep",
        "0,3",
        "--max-source-positions",
        "32",
    )
    flags += ("--lr", "1e-9", "--no-epoch-checkpoints")  # (the update moves the weights by ~nothing)
    assert train_main(base_args(databin, save, *flags, "--max-update", "1")) == 0
    t = load_checkpoint_file(teacher)["model"]
    s = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    assert s["args"]["decoder_layers"] == 2 and s["args"]["decoder_layers_to_keep"] == "0,3"
    assert sorted({k.split(".")[2] for k in s["model"] if k.startswith("decoder.layers.")}) == ["0", "1"]
    for new, old in ((0, 0), (1, 3)):
        k = f"decoder.layers.{new}.fc1.weight"
        assert torch.allclose(s["model"][k], t[f"decoder.layers.{old}.fc1.weight"], atol=1e-6), k
    # the same command again resumes the 2-layer student from checkpoint_last.pt (no second pruning)
    assert train_main(base_args(databin, save, *flags, "--max-update", "2")) == 0
    again = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    assert again["extra_state"]["num_updates"] == 2 and again["args"]["decoder_layers"] == 2


def test_longer_sources_than_the_checkpoint_in_training_and_generation(databin, teacher, tmp_path):
    save = str(tmp_path / "long")
    flags = ("--finetune-from-model", teacher, "--decoder-layers", "4", "--max-source-positions", "64")
    assert train_main(base_args(databin, save, *flags, "--max-update", "1", "--no-epoch-checkpoints")) == 0
    last = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    assert last["model"]["encoder.embed_positions.weight"].shape[0] == 66
    # generation with the teacher (32 positions) and --max-source-positions 64: a 50-word source is read whole
    src = tmp_path / "long.txt"
    src.write_text(" ".join(f"w{i % 30}" for i in range(50)) + "\n")

    def source_read(*extra: str) -> list[str]:
        argv = [databin, "--path", teacher, "--input", str(src), "--beam", "2", "--cpu", *extra]
        lines = generate(parse_generation_args(argv), out=io.StringIO())["lines"]
        return next(line for line in lines if line.startswith("S-0\t")).split("\t")[1].split()

    assert len(source_read("--max-source-positions", "64")) == 50  # read whole by the extended positions
    assert len(source_read()) == 31  # the checkpoint's 32 positions: cut to 31 tokens and </s>
