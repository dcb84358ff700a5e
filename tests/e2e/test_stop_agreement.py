"""Stop decisions agreed by all ranks: 2 gloo processes whose clocks disagree.

The test's own entry point (written next to the run, not part of seqtrain) moves rank 1's training clock two
hours ahead from its third update on, so with --stop-time-hours 1 only rank 1 sees the budget spent. Decided per
rank, rank 1 would validate and save while rank 0 waits in the next update's gradient all-reduce: a hang until
the timeout. Agreed (seqtrain.distributed.agree), both stop after update 3, save once and exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from seqtrain.checkpoint.files import load_checkpoint_file

SKEWED_ENTRY = textwrap.dedent("""
    import sys

    from seqtrain import distributed
    from seqtrain.train.trainer import Trainer

    _real_clock = Trainer.cumulative_training_time

    def _skewed_clock(self):
        ahead = distributed.get_rank() == 1 and self.num_updates >= 3
        return _real_clock(self) + (2 * 3600.0 if ahead else 0.0)

    Trainer.cumulative_training_time = _skewed_clock  # also in the spawned ranks, which import this module

    if __name__ == "__main__":
        from seqtrain_cli.train import cli_main

        cli_main(sys.argv[1:])
""")


@pytest.mark.slow
def test_ranks_with_skewed_clocks_stop_at_the_same_update(toy_databin, tmp_path):
    entry = tmp_path / "skewed_train.py"
    entry.write_text(SKEWED_ENTRY)
    save_dir = tmp_path / "ckpt"
    args = [
        toy_databin(n_train=100, n_valid=40),
        "--arch",
        "bart_tiny",
        "--cpu",
        "--distributed-world-size",
        "2",
        "--batch-size",
        "8",
        "--lr",
        "1e-3",
        "--max-update",
        "50",
        "--stop-time-hours",
        "1",
        "--no-epoch-checkpoints",
        "--save-dir",
        str(save_dir),
        "--log-format",
        "simple",
        "--log-interval",
        "1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        [sys.executable, str(entry), *args], env=env, capture_output=True, text=True, timeout=150
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Stopping training due to cumulative_training_time" in out
    saves = re.findall(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates", out)
    assert saves == ["3"], out[-4000:]  # once, after the update where rank 1's clock ran out
    state = load_checkpoint_file(str(save_dir / "checkpoint_last.pt"))
    assert state["extra_state"]["num_updates"] == 3
    assert "num_updates=4" not in out and "| num_updates 4" not in out
