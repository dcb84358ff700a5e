"""What a checkpoint read keeps is what was saved (issue 31, item 6): the mapped read checks the weights it
keeps and the archive's own records against the zip's CRC-32s, refuses NaN / infinite weights with one line,
and leaves the parts it does not read (a training checkpoint's optimizer state) unread and unjudged."""

from __future__ import annotations

import argparse
import struct
import zipfile
import zlib

import pytest
import torch

from seqtrain.checkpoint.files import save_checkpoint_file
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model


def make_dict(n_words: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def save_tiny(path: str, optimizer=None, change=None) -> dict[str, torch.Tensor]:
    d = make_dict()
    torch.manual_seed(0)
    args = argparse.Namespace(arch="bart_tiny", encoder_layers=1, decoder_layers=1, dropout=0.0)
    state = build_model(args, d, d).state_dict()
    if change is not None:
        change(state)
    save_checkpoint_file(make_checkpoint_state(args, state, d, d, optimizer=optimizer), path)
    return state


def record_data_offset(path: str, name: str) -> tuple[int, int]:
    """(offset of the first data byte, size) of zip record `name` in `path`."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def record_of(path: str, tensor: torch.Tensor) -> str:
    """The data record holding `tensor`'s bytes (matched by CRC-32)."""
    storage = tensor.untyped_storage()
    crc = zlib.crc32(torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),)).numpy())
    with zipfile.ZipFile(path) as z:
        return next(i.filename for i in z.infolist() if "/data/" in i.filename and i.CRC == crc)


def test_flipped_byte_in_a_weight_is_refused_naming_it(tmp_path):
    """A flipped bit in a weight loaded silently through the mapped read (torch.load checks no CRC)."""
    path = str(tmp_path / "ck.pt")
    state = save_tiny(path)
    key = "encoder.layers.0.fc1.weight"
    offset, size = record_data_offset(path, record_of(path, state[key]))
    flip(path, offset + size // 2)
    with pytest.raises(SeqtrainError) as e:
        read_checkpoint(path)
    assert str(e.value) == (
        f"{path} is corrupted: the bytes of weight {key!r} fail the archive's CRC-32 checksum (a damaged copy or "
        "disk); use an intact copy of the checkpoint"
    )


def test_flipped_byte_in_the_pickle_is_refused(tmp_path):
    """data.pkl holds the args, dictionaries and counters: a flipped byte in a string there (the arch's name)
    used to load as another value."""
    path = str(tmp_path / "ck.pt")
    save_tiny(path)
    name = next(n for n in zipfile.ZipFile(path).namelist() if n.endswith("/data.pkl"))
    offset, size = record_data_offset(path, name)
    with open(path, "rb") as f:
        f.seek(offset)
        at = f.read(size).index(b"bart_tiny")
    flip(path, offset + at + 8)  # bart_tiny -> bart_tinx
    with pytest.raises(SeqtrainError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path} is truncated or corrupted (Bad CRC-32 for file '{name}')"


def test_damage_outside_the_weights_is_not_read(tmp_path):
    """The mapped read keeps its point: a training checkpoint's optimizer state is neither read nor checked,
    so damage there does not stop generation (resuming checks every record: checkpoint_problem)."""
    path = str(tmp_path / "ck.pt")
    moment = torch.full((1000,), 0.5)
    state = save_tiny(path, optimizer={"state": {0: {"exp_avg": moment}}, "param_groups": []})
    offset, size = record_data_offset(path, record_of(path, moment))
    flip(path, offset + size // 2)
    ck = read_checkpoint(path)
    assert all(torch.equal(ck.model[k], v) for k, v in state.items())


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_naming_the_first(tmp_path, value):
    """A model with NaN weights crashed seqtrain-generate with an IndexError deep inside the search."""
    path = str(tmp_path / "ck.pt")

    def poison(state):
        state["decoder.layers.0.fc2.bias"][3] = value
        state["decoder.layers.0.fc2.bias"][5] = value

    save_tiny(path, change=poison)
    with pytest.raises(SeqtrainError) as e:
        read_checkpoint(path)
    assert str(e.value) == (
        f"{path}: weight 'decoder.layers.0.fc2.bias' holds 2 non-finite value(s) (the first: {value}); the model "
        "is broken (a diverged or damaged run): use an earlier checkpoint"
    )


def test_large_finite_weights_whose_sum_overflows_are_accepted(tmp_path):
    path = str(tmp_path / "ck.pt")

    def big(state):
        state["decoder.layers.0.fc2.bias"].fill_(3e38)  # finite, but their sum overflows to inf

    save_tiny(path, change=big)
    assert torch.isinf(read_checkpoint(path).model["decoder.layers.0.fc2.bias"].sum())
