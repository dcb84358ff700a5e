"""Frozen weights (--freeze-encoder, --freeze-embeddings, --freeze-params): what freezes, that training leaves it
bit for bit and keeps no optimizer state for it, and that a frozen run resumes bitwise."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain.models.freeze import freeze
from seqtrain_cli.train import train_main
from tests.utils import base_args


def tiny(**kw) -> torch.nn.Module:
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    return build_model(model_config(argparse.Namespace(arch="bart_tiny", **kw)), d, d)


def trainable(model) -> set[str]:
    return {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}


def test_what_each_flag_freezes():
    m = tiny()
    frozen = freeze(m, encoder=True)
    assert all(not n.startswith("encoder.") for n in trainable(m))
    # the token embeddings are one tensor for encoder, decoder and output: frozen with the encoder
    assert {"decoder.embed_tokens.weight", "decoder.output_projection.weight"} <= set(frozen)
    assert "decoder.layers.0.fc1.weight" in trainable(m) and "decoder.embed_positions.weight" in trainable(m)
    m = tiny()
    freeze(m, embeddings=True)
    assert not {n for n in trainable(m) if "embed_" in n or "output_projection" in n}
    assert "encoder.layers.0.fc1.weight" in trainable(m)
    m = tiny()
    freeze(m, params=r"^decoder\.layers\.1\.")
    assert {n for n, p in m.named_parameters() if not p.requires_grad} == {
        n for n, _ in m.named_parameters() if n.startswith("decoder.layers.1.")
    }
    with pytest.raises(SeqtrainError, match=r"^--freeze-params 'nothing_here' matches no parameter"):
        freeze(tiny(), params="nothing_here")
    with pytest.raises(SeqtrainError, match=r"^--freeze-params '\(': not a valid regular expression"):
        freeze(tiny(), params="(")
    with pytest.raises(SeqtrainError, match="every parameter is frozen"):
        freeze(tiny(), params=".")


def test_no_gradient_is_computed_for_frozen_weights():
    m = tiny(dropout=0.0)
    freeze(m, encoder=True)
    src = torch.tensor([[5, 6, 7, 2]])
    prev = torch.tensor([[2, 8, 9]])
    m(src, torch.tensor([4]), prev)[0].sum().backward()
    assert all(p.grad is None for n, p in m.named_parameters() if n.startswith("encoder."))
    assert m.decoder.layers[0].fc1.weight.grad is not None


@pytest.mark.slow
def test_frozen_encoder_stays_bitwise_and_the_run_resumes_bitwise(databin, tmp_path):
    start = str(tmp_path / "start")
    assert train_main(base_args(databin, start, "--max-update", "2", "--no-epoch-checkpoints")) == 0
    pretrained = os.path.join(start, "checkpoint_last.pt")
    flags = ("--finetune-from-model", pretrained, "--freeze-encoder", "--no-epoch-checkpoints")
    full = str(tmp_path / "full")
    assert train_main(base_args(databin, full, *flags, "--max-update", "6")) == 0
    before, after = (
        load_checkpoint_file(pretrained),
        load_checkpoint_file(os.path.join(full, "checkpoint_last.pt")),
    )
    enc = [k for k in before["model"] if k.startswith("encoder.")]
    assert enc and all(torch.equal(before["model"][k], after["model"][k]) for k in enc)
    assert not torch.equal(
        before["model"]["decoder.layers.0.fc1.weight"], after["model"]["decoder.layers.0.fc1.weight"]
    )
    # optimizer state only for the trainable tensors
    m = tiny()
    freeze(m, encoder=True)
    n_trainable = sum(1 for p in m.parameters() if p.requires_grad)
    assert len(after["optimizer"]["state"]) == n_trainable < sum(1 for _ in m.parameters())
    # stopped after 3 updates and relaunched: bitwise the unbroken run
    part = str(tmp_path / "part")
    assert train_main(base_args(databin, part, *flags, "--max-update", "3")) == 0
    assert train_main(base_args(databin, part, *flags, "--max-update", "6")) == 0
    resumed = load_checkpoint_file(os.path.join(part, "checkpoint_last.pt"))
    assert all(torch.equal(resumed["model"][k], after["model"][k]) for k in after["model"])
