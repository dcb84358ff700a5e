"""Trackers (seqtrain.logging.trackers): one interface for TensorBoard, Weights & Biases and JSON lines; a training
run with all three logs the same per-update figures to each (wandb in WANDB_MODE=offline, read back from its
run file)."""

from __future__ import annotations

import glob
import json
import math
import os
import struct
import subprocess
import sys

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.logging.trackers import JsonLinesTracker, Tracker, Trackers
from tests.utils import REPO, base_args


class Recorder(Tracker):
    def __init__(self):
        self.rows, self.closed = [], False

    def log(self, tag, stats, step):
        self.rows.append((tag, step, dict(stats)))

    def close(self):
        self.closed = True


def test_jsonl_tracker_and_fan_out(tmp_path):
    path = tmp_path / "logs" / "m.jsonl"
    rec = Recorder()
    both = Trackers([JsonLinesTracker(str(path)), rec])
    both.log("train_inner", {"loss": 2.5, "ppl": math.inf, "lr": 1e-3, "num_updates": 7, "name": "x"}, 7)
    both.log("valid", {"loss": 2.25, "best_loss": 2.25}, 8)
    both.close()
    rows = [json.loads(line) for line in open(path)]
    assert rows == [
        {
            "tag": "train_inner",
            "step": 7,
            "loss": 2.5,
            "lr": 1e-3,
        },  # non-finite and non-numeric values dropped
        {"tag": "valid", "step": 8, "loss": 2.25, "best_loss": 2.25},
    ]
    assert rec.closed and rec.rows[1] == ("valid", 8, {"loss": 2.25, "best_loss": 2.25})


def test_jsonl_tracker_unwritable(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SeqtrainError, match="--jsonl-log .*: cannot write"):
        JsonLinesTracker(str(tmp_path / "file" / "m.jsonl"))


def _wandb_records(path: str) -> list[bytes]:
    """The records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB-log blocks of 32 KiB
    holding chunks (4-byte checksum, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            records.append(pending)
        if kind == 0 and length == 0:
            break
    return records


def _wandb_history(run_dir: str) -> list[dict]:
    """The history rows of an offline wandb run, read from its .wandb file."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run_dir, "*.wandb"))
    rows = []
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})  # fmt: skip
    return rows


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_logs_to_tensorboard_wandb_and_jsonl(databin, tmp_path):
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install 'seqtrain[wandb]'")
    save = str(tmp_path / "ck")
    jsonl = str(tmp_path / "metrics.jsonl")
    argv = base_args(databin, save, "--max-update", "6", "--log-interval", "1", "--log-format", "simple",
                     "--jsonl-log", jsonl, "--wandb-project", "seqtrain-test", "--wandb-run-name", "tiny",
                     "--tensorboard-logdir", str(tmp_path / "tb"))  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), WANDB_MODE="offline", WANDB_SILENT="true",
               WANDB_DIR=str(tmp_path), OMP_NUM_THREADS="1")  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "seqtrain_cli.train", *argv], capture_output=True, text=True,
                         env=env, timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in open(jsonl)]
    inner = [r for r in rows if r["tag"] == "train_inner"]
    assert [r["step"] for r in inner] == [1, 2, 3, 4, 5, 6]
    assert {r["tag"] for r in rows} >= {"train_inner", "train", "valid"}

    (run_dir,) = glob.glob(os.path.join(save, "wandb", "offline-run-*"))
    history = _wandb_history(run_dir)
    losses = [(h["_step"], h["train_inner/loss"]) for h in history if "train_inner/loss" in h]
    assert losses == [(r["step"], r["loss"]) for r in inner]  # the same figures in both trackers

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb" / "train_inner"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("loss")] == [(s, round(v, 6)) for s, v in losses]


@pytest.mark.slow
def test_wandb_without_an_api_key_is_one_line(databin, tmp_path):
    """wandb installed, no API key, no terminal, no server in reach. Before (issue 31): wandb's UsageError
    ended training in a traceback; now one line saying how to log in or log offline, exit 1, promptly."""
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install 'seqtrain[wandb]'")
    save = str(tmp_path / "ck")
    argv = base_args(databin, save, "--max-update", "2", "--wandb-project", "seqtrain-test")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), OMP_NUM_THREADS="1", WANDB_DIR=str(tmp_path),
               WANDB_BASE_URL="http://127.0.0.1:9")  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "seqtrain_cli.train", *argv], capture_output=True, text=True,
                         env=env, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    lines = [ln for ln in out.stderr.splitlines() if " | INFO | " not in ln and " | WARNING | " not in ln]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines == [
        "seqtrain-train: error: --wandb-project seqtrain-test: W&B did not start (No API key configured. Use "
        "`wandb login` to log in.); log in with `wandb login` (or set WANDB_API_KEY), or log offline with "
        "WANDB_MODE=offline and upload later with `wandb sync`"
    ], out.stderr
