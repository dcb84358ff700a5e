"""Fine-tunes that survive preemption: `--restore-file PRETRAINED --reset-*` initialises only a first launch; the
same command relaunched after a kill resumes from checkpoint_last.pt and ends bitwise equal to a run never killed.
--restore-file-always gives fairseq's reload at every launch."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.utils import load_script

RESETS = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]


def _finetune_cmd(chaos, data, pretrained, save, max_update, *extra):
    return (
        chaos.train_command()
        + chaos.train_args(data, save, max_update)
        + ["--restore-file", pretrained, *RESETS, "--dropout", "0.1", *extra]
    )


def _run(cmd, chaos):
    out = subprocess.run(cmd, env=chaos.child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    chaos = load_script("dev/chaos_resume")
    root = tmp_path_factory.mktemp("ft")
    data = chaos.make_databin(str(root / "data"))
    # "pretrained weights": a short run of the same model
    _run(chaos.train_command() + chaos.train_args(data, str(root / "pre"), 6, prune=True), chaos)
    pretrained = str(root / "pretrained.pt")
    shutil.copy(root / "pre" / "checkpoint_last.pt", pretrained)
    return chaos, data, pretrained, root


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_finetune_relaunched_unchanged_is_bitwise_exact(setup):
    chaos, data, pretrained, root = setup
    ref_dir, run_dir = str(root / "ref"), str(root / "run")
    out = _run(_finetune_cmd(chaos, data, pretrained, ref_dir, 30), chaos)
    assert f"initialising from --restore-file {pretrained}" in out and "reset: optimizer" in out
    reference = chaos.load(os.path.join(ref_dir, "checkpoint_last.pt"))
    assert reference["extra_state"]["num_updates"] == 30

    cmd = _finetune_cmd(chaos, data, pretrained, run_dir, 30)
    run = chaos.Run(cmd, chaos.child_env())
    deadline = time.monotonic() + 240
    while (chaos.saved_updates(run_dir) or 0) < 8 and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.05)
    assert run.kill_after(0.3, after_training_starts=False), run.output()
    killed = chaos.load(os.path.join(run_dir, "checkpoint_last.pt"))["extra_state"]
    assert 8 <= killed["num_updates"] < 30
    assert killed["train_iterator"]["iterations_in_epoch"] > 0  # killed mid-epoch

    relaunch = chaos.Run(cmd, chaos.child_env())  # the same command, unchanged
    assert relaunch.wait(timeout=300) == 0, relaunch.output()
    log = relaunch.output()
    assert f"resuming from {os.path.join(run_dir, 'checkpoint_last.pt')}" in log, log
    assert "initialising from --restore-file" not in log
    final = chaos.load(os.path.join(run_dir, "checkpoint_last.pt"))
    assert chaos.compare_states(final, reference) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restore_file_always_reloads_like_fairseq(setup):
    chaos, data, pretrained, root = setup
    save = str(root / "always")
    cmd = _finetune_cmd(chaos, data, pretrained, save, 4, "--restore-file-always")
    _run(cmd, chaos)
    first = chaos.load(os.path.join(save, "checkpoint_last.pt"))
    again = _run(cmd, chaos)
    assert f"initialising from --restore-file {pretrained} (--restore-file-always); reset: optimizer" in again
    # started over from the pretrained weights: the same 4 updates again, bitwise
    assert chaos.compare_states(chaos.load(os.path.join(save, "checkpoint_last.pt")), first) == []
