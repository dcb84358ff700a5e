"""End-to-end training: the loss falls, checkpoint flags write exactly fairseq's files, logs and TensorBoard
scalars are there. Tiny: bart_tiny on a 200-example copy-and-reverse task, a few dozen updates per run."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.logging.meters import AverageMeter, MetersDict, TimeMeter
from seqtrain.logging.progress import progress_bar
from seqtrain_cli.train import train_main
from tests.utils import base_args, parse_log


def ckpt_files(folder: str) -> list:
    """The checkpoint files of a save dir (not its config.yaml, nor hidden files)."""
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder) if not n.startswith(".") and n != "config.yaml")


@pytest.mark.slow
def test_loss_falls_and_valid_improves(databin, tmp_path):
    log = str(tmp_path / "train.log")
    train_main(
        base_args(
            databin,
            str(tmp_path / "ck"),
            "--lr",
            "5e-3",
            "--max-update",
            "40",
            "--log-format",
            "simple",
            "--log-file",
            log,
            "--log-interval",
            "10",
            "--no-epoch-checkpoints",
            "--validate-interval",
            "3",
        )
    )
    train = parse_log(log, "train")
    valid = parse_log(log, "valid")
    assert len(train) == 10 and len(valid) == 4  # 4 updates per epoch; validation every 3rd epoch + the last
    assert train[-1]["num_updates"] == 40
    assert train[-1]["loss"] < train[0]["loss"] - 1.0, (train[0], train[-1])
    assert valid[-1]["loss"] < valid[0]["loss"] - 0.8, (valid[0], valid[-1])
    assert valid[-1]["best_loss"] == valid[-1]["loss"]
    # fairseq's columns, in fairseq's order
    text = open(log, encoding="utf-8").read()
    keys = [p.split(" ")[0] for p in re.search(r"\| train \| epoch 010 \| (.*)", text).group(1).split(" | ")]
    assert keys == [
        "loss",
        "nll_loss",
        "ppl",
        "wps",
        "ups",
        "wpb",
        "bsz",
        "num_updates",
        "lr",
        "gnorm",
        "train_wall",
        "wall",
    ]
    inner = re.findall(r"\| train_inner \| epoch (\d+):\s+(\d+) / 4 (?:\(eta \w+\) )?loss=", text)
    assert inner[0] == ("003", "2")  # update 10 is the 2nd of epoch 3
    best = torch.load(tmp_path / "ck" / "checkpoint_best.pt", weights_only=True)
    assert best["extra_state"]["best"] == pytest.approx(valid[-1]["loss"])
    assert best["format"] == "seqtrain" and best["args"]["arch"] == "bart_tiny"
    assert best["src_dict"] == best["tgt_dict"] and best["tokenizer"]["kind"] == "none"


CHECKPOINT_CASES = [
    # (flags, expected files)
    (["--max-epoch", "2"], ["checkpoint1.pt", "checkpoint2.pt", "checkpoint_best.pt", "checkpoint_last.pt"]),
    (
        [
            "--max-update",
            "7",
            "--no-epoch-checkpoints",
            "--save-interval-updates",
            "1",
            "--keep-interval-updates",
            "2",
        ],
        ["checkpoint_2_6.pt", "checkpoint_2_7.pt", "checkpoint_best.pt", "checkpoint_last.pt"],
    ),
    (
        ["--max-epoch", "3", "--keep-last-epochs", "1", "--keep-best-checkpoints", "2"],
        [
            "checkpoint.best_loss_{1}.pt",
            "checkpoint.best_loss_{2}.pt",
            "checkpoint3.pt",
            "checkpoint_best.pt",
            "checkpoint_last.pt",
        ],
    ),
    (
        ["--max-epoch", "3", "--save-interval", "2", "--no-last-checkpoints"],
        ["checkpoint2.pt", "checkpoint_best.pt"],
    ),
    (["--max-epoch", "2", "--no-save"], []),
]


@pytest.mark.parametrize(
    "flags,expected", CHECKPOINT_CASES, ids=["default", "interval", "keep", "save-interval", "no-save"]
)
@pytest.mark.slow
def test_checkpoint_flags_write_exactly_these_files(databin, tmp_path, flags, expected):
    save_dir = str(tmp_path / "ck")
    log = str(tmp_path / "log")
    train_main(base_args(databin, save_dir, "--log-format", "simple", "--log-file", log, *flags))
    if "{1}" in " ".join(expected):
        # the 2 best validation losses (3 decimals) of the 3 epochs name the kept best checkpoints
        losses = sorted(s["loss"] for s in parse_log(log, "valid"))[:2]
        expected = [e.replace("{1}", f"{losses[1]:.3f}").replace("{2}", f"{losses[0]:.3f}") for e in expected]
        expected = sorted(expected)
    assert ckpt_files(save_dir) == expected
    if "checkpoint_last.pt" in expected and "checkpoint_best.pt" in expected:
        last = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)
        assert last["extra_state"]["num_updates"] == (7 if "--max-update" in flags else 4 * int(flags[1]))
        # the last save was also the best (loss falls every epoch): one file, several names
        assert (
            os.stat(os.path.join(save_dir, "checkpoint_last.pt")).st_ino
            == os.stat(os.path.join(save_dir, "checkpoint_best.pt")).st_ino
        )


@pytest.mark.slow
def test_tensorboard_scalars_and_json_log(databin, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    log = tmp_path / "log.json"
    train_main(
        base_args(
            databin,
            str(tmp_path / "ck"),
            "--max-update",
            "6",
            "--log-interval",
            "2",
            "--tensorboard-logdir",
            str(tb),
            "--peak-flops",
            "1e12",
            "--log-format",
            "json",
            "--log-file",
            str(log),
            "--no-save",
            "--profile",
            "2",
        )
    )
    scalars = {}
    for tag in ("train", "train_inner", "valid"):
        acc = EventAccumulator(str(tb / tag))
        acc.Reload()
        scalars[tag] = set(acc.Tags()["scalars"])
    for key in (
        "loss",
        "nll_loss",
        "ppl",
        "lr",
        "gnorm",
        "wps",
        "ups",
        "wpb",
        "bsz",
        "train_wall",
        "mfu",
        "wall",
    ):
        assert key in scalars["train"] and key in scalars["train_inner"], key
    assert {"loss", "nll_loss", "ppl", "wps", "wpb", "bsz"} <= scalars["valid"]
    acc = EventAccumulator(str(tb / "train_inner"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [2, 4, 6]
    # mfu = counted FLOP/s / peak (seqtrain/train/flops.py), timed like wps: mfu * peak / wps is the interval's FLOPs
    # per target token, which lies between the smallest and largest per-pair figure of the training data
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain.train.flops import Seq2SeqFlops

    src = MMapIndexedDataset(os.path.join(databin, "train.src-tgt.src")).sizes
    tgt = MMapIndexedDataset(os.path.join(databin, "train.src-tgt.tgt")).sizes
    with open(os.path.join(databin, "dict.tgt.txt"), encoding="utf-8") as f:
        vocab = 4 + sum(1 for _ in f)  # the 4 special symbols come first
    fl = Seq2SeqFlops(2, 2, 64, 64, 128, 128, vocab)  # bart_tiny
    per_token = [fl.train_flops([s], [t]) / t for s, t in zip(src.tolist(), tgt.tolist())]
    mfu, wps = acc.Scalars("mfu")[0].value, acc.Scalars("wps")[0].value
    assert min(per_token) * 0.99 < mfu * 1e12 / wps < max(per_token) * 1.01
    # the json log: one object per line after the fairseq prefix
    lines = [
        json.loads(line.split(" | ", 3)[3])
        for line in log.read_text().splitlines()
        if " | train_inner | " in line or " | train | " in line
    ]
    assert [d["update"] for d in lines if "update" in d] == [0.5, 1.0, 1.5]
    assert lines[-1]["epoch"] == 2 and lines[-1]["train_num_updates"] == 6
    # --profile 2: one torch.profiler trace of the 2 updates after a warm-up update
    traces = [n for n in os.listdir(tb / "profile") if n.endswith(".pt.trace.json")]
    assert len(traces) == 1


def test_user_errors_are_one_line(databin, tmp_path):
    with pytest.raises(SeqtrainError, match="--arch is required"):
        train_main([databin, "--max-tokens", "512"])
    with pytest.raises(SeqtrainError, match="--max-tokens or --batch-size"):
        train_main([databin, "--arch", "bart_tiny"])
    with pytest.raises(SeqtrainError, match=r"DATA .*nowhere: not a folder"):
        train_main([str(tmp_path / "nowhere"), "--arch", "bart_tiny", "--max-tokens", "512"])
    with pytest.raises(SeqtrainError, match="--fp16 needs a CUDA device"):
        train_main(base_args(databin, str(tmp_path / "ck"), "--fp16"))


def test_meters_and_progress_formats(caplog):
    m = MetersDict()
    m.log_scalar("loss", 2.0, weight=1, round=3)
    m.log_scalar("loss", 5.0, weight=2, round=3)
    m.log_derived("ppl", lambda d: round(2 ** d.avg("loss"), 2))
    m.log_last("lr", 0.00097931)
    assert m.smoothed_values() == {"loss": 4.0, "ppl": 16.0, "lr": 0.00097931}
    restored = MetersDict()
    restored.load_state_dict(m.state_dict())
    restored.log_derived("ppl", lambda d: round(2 ** d.avg("loss"), 2))
    assert restored.smoothed_values() == m.smoothed_values()
    t = TimeMeter()
    t.load_state_dict({"kind": "time", "init": 10.0, "n": 50, "round": None})
    assert 4.9 < t.avg <= 5.0 and t.elapsed_time >= 10.0
    a = AverageMeter(round=1)
    a.update(1152.04)
    assert a.smoothed_value == 1152.0

    caplog.set_level(logging.INFO)
    bar = progress_bar(range(16), "simple", epoch=1, total=16)
    for i in bar:
        if i == 9:
            bar.log({"loss": 7.592, "lr": 0.001, "wpb": 1209.6}, tag="train_inner", step=10)
    bar.print({"loss": 7.454, "num_updates": 16}, tag="train", step=16)
    msgs = [r.getMessage() for r in caplog.records if r.name in ("train_inner", "train")]
    assert msgs == [
        "epoch 001:    10 / 16 loss=7.592, lr=0.001, wpb=1209.6",
        "epoch 001 | loss 7.454 | num_updates 16",
    ]


@pytest.mark.slow
def test_patience_stops_when_validation_stops_improving(databin, tmp_path):
    # With --maximize-best-checkpoint-metric a falling loss never improves: epoch 1 sets the best, epochs 2 and 3
    # do not, so --patience 2 stops after epoch 3 although --max-epoch allows 10.
    save_dir = str(tmp_path / "ck")
    train_main(
        base_args(
            databin,
            save_dir,
            "--max-epoch",
            "10",
            "--patience",
            "2",
            "--maximize-best-checkpoint-metric",
            "--no-epoch-checkpoints",
        )
    )
    last = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)
    assert last["extra_state"]["num_updates"] == 12
    manager = last["extra_state"]["checkpoint_manager"]
    assert manager["patience_runs"] == 2 and manager["best"] == manager["patience_best"]
    best = torch.load(os.path.join(save_dir, "checkpoint_best.pt"), weights_only=True)
    assert best["extra_state"]["num_updates"] == 4  # the highest loss: epoch 1


@pytest.mark.slow
def test_bf16_autocast_on_cpu_trains(databin, tmp_path):
    save_dir = str(tmp_path / "ck")
    train_main(base_args(databin, save_dir, "--bf16", "--max-update", "3", "--no-epoch-checkpoints"))
    last = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)
    assert last["extra_state"]["num_updates"] == 3
    assert last["model"]["encoder.layers.0.fc1.weight"].dtype == torch.float32  # fp32 master weights
    assert last["loss_scaler"] is None  # bf16 needs no loss scaling


@pytest.mark.cuda
def test_fp16_and_bf16_on_cuda(databin, tmp_path):
    for precision in ("--fp16", "--bf16"):
        save_dir, log = str(tmp_path / precision), str(tmp_path / f"{precision}.log")
        argv = [a for a in base_args(databin, save_dir) if a != "--cpu"]
        train_main(
            argv
            + [
                precision,
                "--max-update",
                "4",
                "--log-format",
                "simple",
                "--log-file",
                log,
                "--log-interval",
                "1",
                "--no-epoch-checkpoints",
            ]
        )
        last = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)
        assert last["extra_state"]["num_updates"] == 4
        inner = parse_log(log, "train")
        if precision == "--fp16":
            assert last["loss_scaler"]["loss_scale"] > 0 and "loss_scale" in inner[-1]
        else:
            assert last["loss_scaler"] is None
        assert inner[-1]["loss"] < 6
