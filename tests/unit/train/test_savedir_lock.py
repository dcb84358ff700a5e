"""One training run per --save-dir (seqtrain.train.savedir_lock): the lock refuses a second owner with a one-line error
naming the first, is taken over when its owner is gone, and the real CLI keeps a live run's checkpoints intact."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.train.savedir_lock import LOCK_NAME, STALE_AFTER_S, SaveDirLock, process_start_time
from tests.utils import load_script


def _write_owner(folder, **record):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_NAME), "w") as f:
        json.dump(record, f)


def test_second_lock_refused_naming_owner_then_released(tmp_path):
    first = SaveDirLock(str(tmp_path))
    first.acquire()
    try:
        with pytest.raises(SeqtrainError) as e:
            SaveDirLock(str(tmp_path)).acquire()
        msg = str(e.value)
        assert "\n" not in msg and "in use by another training run" in msg
        assert f"host {socket.gethostname()}, pid {os.getpid()}, since " in msg
        assert "use another --save-dir" in msg
        owner = json.load(open(tmp_path / LOCK_NAME))
        assert owner["run_id"] == first.record["run_id"]
        assert owner["proc_start"] == process_start_time(os.getpid())
    finally:
        first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    assert os.listdir(tmp_path) == []  # no temporary record left either
    second = SaveDirLock(str(tmp_path))
    second.acquire()
    second.release()


def test_stale_locks_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exited, not reaped yet: os.kill(pid, 0) works
    while (
        process_start_time(zombie.pid) is not None
        and open(f"/proc/{zombie.pid}/stat").read().split(")")[1][1] != "Z"
    ):
        time.sleep(0.01)
    host = socket.gethostname()
    cases = {
        "dead pid": dict(host=host, pid=dead.pid, started=0, heartbeat=time.time()),
        "zombie": dict(host=host, pid=zombie.pid, started=0, heartbeat=time.time()),
        # a live pid whose process started at another time than the owner's: the pid was reused
        "reused pid": dict(host=host, pid=os.getppid(), proc_start="1", started=0, heartbeat=time.time()),
        "silent host": dict(host="elsewhere", pid=1, started=0, heartbeat=time.time() - STALE_AFTER_S - 5),
    }
    for name, record in cases.items():
        folder = str(tmp_path / name.replace(" ", "_"))
        _write_owner(folder, **record)
        lock = SaveDirLock(folder)
        lock.acquire()
        assert json.load(open(os.path.join(folder, LOCK_NAME)))["run_id"] == lock.record["run_id"], name
        lock.release()
    zombie.wait()


def test_live_owners_refused(tmp_path):
    live = {
        "parent process": dict(
            host=socket.gethostname(),
            pid=os.getppid(),
            proc_start=process_start_time(os.getppid()),
            started=0,
        ),
        "other host, fresh heartbeat": dict(host="node7", pid=4242, started=0, heartbeat=time.time()),
    }
    for name, record in live.items():
        folder = str(tmp_path / name.replace(" ", "_").replace(",", ""))
        _write_owner(folder, **record)
        with pytest.raises(SeqtrainError, match=f"pid {record['pid']}"):
            SaveDirLock(folder).acquire()
        assert json.load(open(os.path.join(folder, LOCK_NAME))) == record, name  # untouched


# ------------------------------------------------------------------------------------------------ the real CLI
def _run(chaos, data, save_dir, max_update):
    return chaos.Run(chaos.train_command() + chaos.train_args(data, save_dir, max_update), chaos.child_env())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_run_refused_first_unharmed(tmp_path):
    chaos = load_script("dev/chaos_resume")
    data = chaos.make_databin(str(tmp_path / "data"))
    save = str(tmp_path / "ck")
    first = _run(chaos, data, save, 60)
    first.training.wait(timeout=120)
    assert os.path.exists(os.path.join(save, LOCK_NAME)), first.output()
    second = subprocess.run(
        chaos.train_command() + chaos.train_args(data, save, 60),
        env=chaos.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.proc.poll() is None, "the first run should still be training"
    assert second.returncode == 1, second.stderr
    err = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and f"pid {first.proc.pid}, since" in err[0], second.stderr
    assert "Loaded checkpoint" not in second.stdout and "Preparing to load" not in second.stdout
    assert first.wait(timeout=240) == 0, first.output()
    # the first run trained to the end, its checkpoints are intact, and it released the lock
    from seqtrain.train.checkpoints import checkpoint_problem

    names = [n for n in os.listdir(save) if n.endswith(".pt")]
    assert "checkpoint_last.pt" in names and all(
        checkpoint_problem(os.path.join(save, n)) is None for n in names
    )
    assert chaos.load(os.path.join(save, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 60
    assert "Free disk space" not in first.output()
    assert not [n for n in os.listdir(save) if n.startswith(".")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_then_same_command_takes_over_and_resumes(tmp_path):
    chaos = load_script("dev/chaos_resume")
    data = chaos.make_databin(str(tmp_path / "data"))
    save = str(tmp_path / "ck")
    run = _run(chaos, data, save, 40)
    deadline = time.monotonic() + 180
    while chaos.saved_updates(save) in (None, 0) and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.05)
    assert run.kill_after(0, after_training_starts=False), run.output()
    killed_at = chaos.saved_updates(save)
    assert killed_at is not None and killed_at < 40
    assert os.path.exists(os.path.join(save, LOCK_NAME))  # left behind by the killed run
    again = _run(chaos, data, save, 40)
    assert again.wait(timeout=240) == 0, again.output()
    out = again.output()
    assert "taking over the stale lock" in out and "is not running" in out, out
    assert "Loaded checkpoint" in out, out
    assert chaos.load(os.path.join(save, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 40
    assert not os.path.exists(os.path.join(save, LOCK_NAME))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_all_ranks_refuse_with_rank0s_error(databin, tmp_path):
    """2 spawned CPU ranks on a save dir held by another run: rank 0 is refused and rank 1 leaves with the same
    one-line error (no hang at a barrier)."""
    from tests.utils import REPO, base_args

    save = str(tmp_path / "ck")
    holder = SaveDirLock(save)
    holder.acquire()
    try:
        argv = base_args(databin, save, "--max-update", "2", "--distributed-world-size", "2")
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        out = subprocess.run(
            [sys.executable, "-m", "seqtrain_cli.train", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
    finally:
        holder.release()
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "is in use by another training run" in last and f"pid {os.getpid()}" in last, out.stderr[-3000:]
    assert os.listdir(save) == []  # nothing read, written or deleted
