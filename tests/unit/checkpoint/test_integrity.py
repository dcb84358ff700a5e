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

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import save_checkpoint_file
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from tests.utils import completed


def make_dict(n_words: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def save_tiny(path: str, optimizer=None, change=None) -> dict[str, torch.Tensor]:
    d = make_dict()
    torch.manual_seed(0)
    args = argparse.Namespace(arch="bart_tiny", encoder_layers=1, decoder_layers=1, dropout=0.0)
    state = build_model(model_config(completed(args)), d, d).state_dict()
    if change is not None:
        change(state)
    save_checkpoint_file(
        make_checkpoint_state(args, state, d, d, training=TrainState(optimizer=optimizer)), path
    )
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


# ------------------------------------------------------------------------------------ what is at the path
def test_checkpoint_path_at_a_fifo_is_refused_not_opened(tmp_path):
    """--path (or convert's input, or --restore-file) at a FIFO waited for ever in open()."""
    import os
    import time

    from seqtrain.checkpoint.files import load_checkpoint_file
    from seqtrain.train.checkpoints import checkpoint_problem

    fifo = str(tmp_path / "model.pt")
    os.mkfifo(fifo)
    started = time.monotonic()
    for load in (read_checkpoint, load_checkpoint_file):
        with pytest.raises(SeqtrainError) as e:
            load(fifo)
        assert str(e.value) == f"{fifo} is a FIFO, not a checkpoint file; give a regular file"
    assert checkpoint_problem(fifo) == "a FIFO, not a checkpoint file"
    assert time.monotonic() - started < 5


# One process per case: before the fix, reading the mapping of a file truncated in place killed it with SIGBUS.
_TRUNCATE = """
import os, sys
import seqtrain.checkpoint.formats as formats
from seqtrain.checkpoint.load import model_from_contents
from seqtrain.errors import SeqtrainError
path, when = sys.argv[1], sys.argv[2]
if when == "after mapping":  # between torch.load's mapping and the checksum pass
    load = formats.load_checkpoint_file
    def truncating(*a, **k):
        obj = load(*a, **k)
        os.truncate(path, 4096)
        return obj
    formats.load_checkpoint_file = truncating
try:
    ck = formats.read_checkpoint(path)
    if when == "before the copy":  # between reading the checkpoint and copying its weights into the model
        os.truncate(path, 4096)
    model_from_contents(ck)
except SeqtrainError as e:
    print(e)
    sys.exit(1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after mapping", "before the copy"])
def test_checkpoint_truncated_in_place_while_mapped_is_one_line(tmp_path, when):
    import os
    import subprocess
    import sys

    path = str(tmp_path / "ck.pt")
    save_tiny(path)
    size = os.path.getsize(path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _TRUNCATE, path, when], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])  # -7: SIGBUS
    assert proc.stdout == (
        f"{path} shrank from {size:,} to 4,096 bytes while it was being read (truncated in place by another "
        "program?); its weights can no longer be read: rerun once nothing writes to it\n"
    )


def test_checkpoint_replaced_by_a_new_save_while_mapped_still_loads(tmp_path):
    """A new save renames another (here smaller) file over the name: the mapping keeps the old file's bytes."""
    import os

    from seqtrain.checkpoint.load import model_from_contents

    path = str(tmp_path / "ck.pt")
    state = save_tiny(path)
    ck = read_checkpoint(path)
    (tmp_path / "small").write_bytes(b"x")
    os.replace(tmp_path / "small", path)
    model = model_from_contents(ck).model
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
