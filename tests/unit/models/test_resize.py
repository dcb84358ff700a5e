"""Fitting checkpoint weights to a model (seqtrain.models.resize): a student that keeps some layers of a deeper
model (--encoder/--decoder-layers-to-keep, fairseq's pruning), and learned positions extended for inputs longer
than the checkpoint was trained on."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain.models.resize import check_state_fits, fit_positions, keep_layers, parse_layers_to_keep
from tests.utils import completed


def make_dict(n: int = 24) -> Dictionary:
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def tiny(d: Dictionary, seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    args = argparse.Namespace(arch="bart_tiny", dropout=0.0, **kw)
    return build_model(model_config(completed(args)), d, d).eval(), args


def batch(src_len: int = 7, tgt_len: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 24, (2, src_len), generator=g)
    src[:, -1] = 2
    prev = torch.randint(4, 24, (2, tgt_len), generator=g)
    prev[:, 0] = 2
    return src, torch.tensor([src_len, src_len]), prev


def test_parse_layers_to_keep():
    assert parse_layers_to_keep("11,0,5", "--decoder-layers-to-keep") == [0, 5, 11]
    assert parse_layers_to_keep(None, "x") is None and parse_layers_to_keep("", "x") is None
    with pytest.raises(
        SeqtrainError, match=r"^--decoder-layers-to-keep: expected comma-separated layer indices"
    ):
        parse_layers_to_keep("0,a", "--decoder-layers-to-keep")
    with pytest.raises(
        SeqtrainError, match=r"^--encoder-layers-to-keep: layer indices must be distinct and >= 0"
    ):
        parse_layers_to_keep("1,1", "--encoder-layers-to-keep")


def test_a_student_keeps_the_chosen_layers_and_computes_as_the_teacher_without_the_others(caplog):
    d = make_dict()
    teacher, _ = tiny(d, encoder_layers=3, decoder_layers=4)
    student, sargs = tiny(d, seed=7, encoder_layers_to_keep="2", decoder_layers_to_keep="3,0")
    assert sargs.encoder_layers == 1 and sargs.decoder_layers == 2  # the count follows the layers kept
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        state = keep_layers(teacher.state_dict(), sargs, "teacher.pt")
    assert "teacher.pt: kept encoder layers 2 of 3; decoder layers 0,3 of 4, renumbered from 0" in caplog.text
    check_state_fits(student, state, "teacher.pt")
    student.load_state_dict(state, strict=True)
    t = teacher.state_dict()
    assert torch.equal(student.state_dict()["decoder.layers.1.fc1.weight"], t["decoder.layers.3.fc1.weight"])
    assert torch.equal(
        student.state_dict()["encoder.layers.0.self_attn.q_proj.weight"],
        t["encoder.layers.2.self_attn.q_proj.weight"],
    )
    # the reference: the teacher itself with the other layers taken out
    teacher.encoder.layers = torch.nn.ModuleList([teacher.encoder.layers[2]])
    teacher.decoder.layers = torch.nn.ModuleList([teacher.decoder.layers[0], teacher.decoder.layers[3]])
    src, lengths, prev = batch()
    with torch.no_grad():
        assert torch.equal(student(src, lengths, prev)[0], teacher(src, lengths, prev)[0])


def test_a_students_own_checkpoint_is_not_pruned_again_and_bad_indices_are_one_line():
    d = make_dict()
    student, sargs = tiny(d, decoder_layers_to_keep="0,3")
    own = student.state_dict()
    assert keep_layers(own, sargs, "student.pt").keys() == own.keys()  # 2 layers kept, 2 in the file: as is
    teacher, _ = tiny(d, decoder_layers=3)
    with pytest.raises(
        SeqtrainError,
        match=r"^teacher.pt: --decoder-layers-to-keep 5: the checkpoint has 3 decoder layers \(0-2\)$",
    ):
        keep_layers(teacher.state_dict(), argparse.Namespace(decoder_layers_to_keep="0,5"), "teacher.pt")


def test_positions_extended_by_copying_compute_the_first_positions_as_before(caplog):
    d = make_dict()
    short, _ = tiny(d, max_source_positions=16, max_target_positions=16)
    long, _ = tiny(d, seed=3, max_source_positions=40, max_target_positions=16)
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        state = fit_positions(short.state_dict(), long, "short.pt")
    assert (
        "short.pt: extended the learned position embeddings by copying the trained rows (encoder 16->40"
        in (caplog.text)
    )
    check_state_fits(long, state, "short.pt")
    long.load_state_dict(state, strict=True)
    old = short.state_dict()["encoder.embed_positions.weight"]
    new = long.state_dict()["encoder.embed_positions.weight"]
    assert new.shape[0] == 42 and torch.equal(new[:18], old)
    assert torch.equal(new[18:34], old[2:18]) and torch.equal(new[34:42], old[2:10])  # position p as p mod 16
    src, lengths, prev = batch(src_len=16)
    with torch.no_grad():
        assert torch.equal(long(src, lengths, prev)[0], short(src, lengths, prev)[0])
    # and the longer model takes sources the short one could not: a training step on 2,048-token sources
    big, _ = tiny(d, seed=4, max_source_positions=2048)
    big.load_state_dict(fit_positions(short.state_dict(), big, "short.pt"), strict=True)
    big.train()
    src, lengths, prev = batch(src_len=2048)
    out = big(src, lengths, prev)[0]
    out.float().logsumexp(-1).mean().backward()
    grad = big.encoder.embed_positions.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad[2000].abs().sum() > 0
