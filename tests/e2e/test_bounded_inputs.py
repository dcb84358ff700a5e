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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
        deadline = time.monotonic() + 120
        # scoring has begun: the early handler (seqtrain_cli._main's, "before any work") is in place from the
        # start, so wait for CPU time past start-up too (~2 s of it; the whole run takes ~9 s), which a loaded
        # machine cannot stretch the way it stretches wall time
        while not _catches(proc.pid, signal.SIGTERM) or _cpu_seconds(proc.pid) < 4.0:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
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
