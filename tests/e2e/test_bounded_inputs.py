"""Reliability, round three (issue 31, item 3): a process stopped promptly, and with one line, while it works on
a large but accepted input."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.utils import REPO


def _catches(pid: int, signum: int) -> bool:
    """The process has a handler of its own for `signum` (SigCgt in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.slow
def test_sigterm_stops_seqtrain_score_inside_a_long_line(tmp_path):
    """Two 4,000-word lines (accepted: the cap is 4,096) keep rouge-score's LCS loop busy for seconds. Before
    (issue 31), SIGTERM's default action ended the process with no line (-15); now: 143, one line, no --json."""
    r = random.Random(0)
    for name in ("sys.txt", "ref.txt"):
        (tmp_path / name).write_text(" ".join(f"w{r.randrange(500)}" for _ in range(4000)) + "\n")
    out = tmp_path / "scores.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqtrain_cli.score", "--sys", str(tmp_path / "sys.txt"), "--ref",
         str(tmp_path / "ref.txt"), "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM):  # scoring has begun
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 5
    assert (proc.returncode, stdout, stderr) == (
        143,
        "",
        "seqtrain-score: stopped by SIGTERM; nothing was written\n",
    )
    assert sorted(os.listdir(tmp_path)) == ["ref.txt", "sys.txt"]  # no --json, no temporary file
