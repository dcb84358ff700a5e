"""Kill anywhere: seqtrain-train is SIGKILLed at seeded random moments and at two aimed points of a checkpoint
write, restarted with the same command each time, and must end bitwise equal to an uninterrupted run.
The harness is scripts/dev/chaos_resume.py (which runs 20 kills); this is its short version."""

from __future__ import annotations

import os
import re

import pytest

from tests.utils import load_script


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_sigkill_anywhere_then_resume_is_bitwise_exact(tmp_path):
    chaos = load_script("dev/chaos_resume")
    lines = []
    # 4 kills: 1 and 3 at seeded random moments during training (updates, validation, checkpoint writes,
    # pruning), kill 2 half-way through writing a checkpoint's temporary file, kill 4 between writing
    # checkpoint_E_U.pt and linking checkpoint_last.pt (and checkpoint_best.pt) to it.
    records, diffs, seconds = chaos.chaos(
        str(tmp_path), kills=4, seed=1234, max_update=80, window=1.0, aimed_every=2, log=lines.append
    )
    # 80 updates: the aimed kills come by the 4th checkpoint write (update 4 at most), so the run cannot finish
    # before the last kill unless it trains 36 updates a second (as the earlier 5 kills in 120 updates)
    assert len(records) == 4, lines  # every kill landed before training finished
    hows = [r["how"] for r in records]
    assert "mid-write" in hows[1] and "between-files" in hows[3], hows
    # the mid-write kill left its half-written temporary file; checkpoint_last.pt was untouched and loads
    assert records[1]["mid_write"] and any(n.endswith(".tmp") for n in records[1]["partial_files"]), records[
        1
    ]
    assert records[1]["updates"] is not None and records[1]["updates"] >= 1
    # the between-files kill: the next update's checkpoint was written (checkpoint_E_U.pt, or checkpointE.pt when
    # that update ended an epoch: then the other names are its links), checkpoint_last.pt lags behind
    between = records[3]
    assert any(
        (n.startswith("checkpoint_") and n.endswith(f"_{between['updates'] + 1}.pt"))
        or re.fullmatch(r"checkpoint\d+\.pt", n)
        for n in between["files"]
    ), between
    # progress was made across the kills, and every resume's state matched the reference at that update
    updates = [r["updates"] for r in records if r["updates"] is not None]
    assert updates == sorted(updates) and updates[-1] > 0, updates
    compared = [r for r in records if r["equal"] is not None]
    assert len(compared) >= 3 and all(r["equal"] for r in compared), records
    assert diffs == [], diffs  # final parameters, optimizer, scheduler, data position: bitwise equal
    assert not [n for n in os.listdir(tmp_path / "chaos") if n.startswith(".")]  # stale temp files cleaned
