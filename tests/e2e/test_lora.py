"""LoRA fine-tuning end to end: from a plain checkpoint, only the adapters move; generation with the LoRA
checkpoint equals generation with its merged exports (seqtrain and fairseq formats)."""

from __future__ import annotations

import io
import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.generation.generate import generate
from seqtrain.generation.options import parse_generation_args
from seqtrain_cli.convert import main as convert_main
from seqtrain_cli.train import train_main
from tests.utils import base_args

pytestmark = pytest.mark.slow


def test_lora_trains_only_adapters_and_generates_as_its_merged_export(databin, tmp_path):
    start = str(tmp_path / "start")
    assert train_main(base_args(databin, start, "--max-update", "2", "--no-epoch-checkpoints")) == 0
    pretrained = os.path.join(start, "checkpoint_last.pt")
    save = str(tmp_path / "lora")
    flags = ("--finetune-from-model", pretrained, "--lora-rank", "4", "--lora-modules", "q_proj,v_proj,fc1")
    assert (
        train_main(
            base_args(databin, save, *flags, "--lr", "1e-2", "--max-update", "6", "--no-epoch-checkpoints")
        )
        == 0
    )
    before = load_checkpoint_file(pretrained)["model"]
    after = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    adapters = [k for k in after["model"] if k.endswith((".lora_A", ".lora_B"))]
    assert adapters and after["args"]["lora_rank"] == 4
    assert all(torch.equal(after["model"][k], before[k]) for k in before)  # every pretrained weight as it was
    assert any(after["model"][k].abs().sum() > 0 for k in adapters if k.endswith("lora_B"))  # B left zero
    assert len(after["optimizer"]["state"]) == len(adapters)
    merged = str(tmp_path / "merged.pt")
    convert_main([os.path.join(save, "checkpoint_last.pt"), merged, "--to", "seqtrain"])
    plain = load_checkpoint_file(merged)
    assert not [k for k in plain["model"] if "lora_" in k] and not plain["args"]["lora_rank"]
    fq = str(tmp_path / "fairseq" / "model.pt")
    convert_main([os.path.join(save, "checkpoint_last.pt"), fq, "--to", "fairseq"])

    def hypotheses(path: str) -> list[str]:
        argv = [databin, "--path", path, "--gen-subset", "valid", "--beam", "3", "--cpu", "--batch-size", "8"]
        return [
            line
            for line in generate(parse_generation_args(argv), out=io.StringIO())["lines"]
            if line[0] in "HP"
        ]

    lora_h = hypotheses(os.path.join(save, "checkpoint_last.pt"))
    assert lora_h and lora_h == hypotheses(merged) == hypotheses(fq)
    assert lora_h != hypotheses(pretrained)  # the adapters changed what the model says
