"""The time left to --max-update / --max-epoch on progress lines, and plain lines instead of a bar off a
terminal."""

from __future__ import annotations

import io
import logging

import pytest

from seqtrain.logging import progress
from seqtrain.logging.eta import Eta, format_duration


def test_format_duration():
    assert [format_duration(s) for s in (0, 44.6, 60, 750, 3600 * 3 + 301, 86400 * 2 + 3600 * 4 + 59)] == [
        "0s",
        "45s",
        "1m00s",
        "12m30s",
        "3h05m",
        "2d04h",
    ]


def test_eta_from_this_launchs_pace():
    now = [100.0]
    eta = Eta(start_updates=200, clock=lambda: now[0])  # a resumed launch: 200 updates done before
    eta.set_target(max_update=800, max_epoch=0, epoch=5, epoch_start_updates=190, per_epoch=50)
    assert eta.text(200) is None  # no update yet in this launch: no pace
    now[0] += 30.0
    assert eta.seconds_left(210) == pytest.approx(590 * 3.0)  # 3 s per update, 590 to go
    assert eta.text(210) == "29m30s"
    # --max-epoch 10 at 50 updates per epoch, epoch 5 started at update 190: 190 + 6 * 50 = 490
    eta.set_target(max_update=0, max_epoch=10, epoch=5, epoch_start_updates=190, per_epoch=50)
    assert eta.target == 490
    eta.set_target(max_update=400, max_epoch=10, epoch=5, epoch_start_updates=190, per_epoch=50)
    assert eta.target == 400  # whichever comes first
    eta.set_target(max_update=0, max_epoch=0, epoch=5, epoch_start_updates=190, per_epoch=50)
    assert eta.text(210) is None  # no limit: nothing to count down to


def test_simple_lines_show_the_eta_beside_the_position(caplog):
    caplog.set_level(logging.INFO)
    bar = progress.progress_bar(range(16), "simple", epoch=1, total=16)
    for i in bar:
        if i == 9:
            bar.eta = "12m30s"
            bar.log({"loss": 7.592, "lr": 0.001}, tag="train_inner", step=10)
    assert [r.getMessage() for r in caplog.records if r.name == "train_inner"] == [
        "epoch 001:    10 / 16 (eta 12m30s) loss=7.592, lr=0.001"
    ]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_only_on_a_terminal(monkeypatch, caplog):
    """--log-format tqdm (quickstart's, and the default on a terminal) writes carriage returns and cursor escapes;
    in a log file or a pipe the same progress comes as plain lines."""
    caplog.set_level(logging.INFO)
    piped = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", piped)
    bar = progress.progress_bar(range(4), "tqdm", epoch=1, total=4)
    assert isinstance(bar, progress.SimpleProgressBar)
    for i in bar:
        if i == 1:
            bar.log({"loss": 3.5}, tag="train_inner", step=2)
    assert piped.getvalue() == ""
    assert [r.getMessage() for r in caplog.records if r.name == "train_inner"] == [
        "epoch 001:     2 / 4 loss=3.5"
    ]
    assert progress.default_log_format() == "simple"

    tty = _Tty()
    monkeypatch.setattr(progress.sys, "stderr", tty)
    assert progress.default_log_format() == "tqdm"
    bar = progress.progress_bar(range(4), "tqdm", epoch=1, total=4)
    assert isinstance(bar, progress.TqdmProgressBar)
    bar._tqdm.fp = tty  # tqdm bound its stream when the bar was made
    for i in bar:
        if i == 1:
            bar.eta = "3s"
            bar.log({"loss": 3.5}, tag="train_inner", step=2)
    assert "\r" in tty.getvalue()
