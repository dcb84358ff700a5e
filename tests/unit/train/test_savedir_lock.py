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
    """The first run has no update limit it could reach during the test (under load the second run can take
    longer to start than 60 updates took), keeps training after the refusal, and is then stopped with SIGTERM."""
    import signal

    chaos = load_script("dev/chaos_resume")
    data = chaos.make_databin(str(tmp_path / "data"))
    save = str(tmp_path / "ck")
    first = _run(chaos, data, save, 100000)
    first.training.wait(timeout=120)
    assert os.path.exists(os.path.join(save, LOCK_NAME)), first.output()
    second = subprocess.run(
        chaos.train_command() + chaos.train_args(data, save, 100000),
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
    # the first run goes on saving after the refusal
    refused_at = chaos.saved_updates(save) or 0
    deadline = time.monotonic() + 120
    while (chaos.saved_updates(save) or 0) < refused_at + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(timeout=240) == 143, first.output()
    # its checkpoints are intact, the last one is where it stopped, and it released the lock
    from seqtrain.train.checkpoints import checkpoint_problem

    names = [n for n in os.listdir(save) if n.endswith(".pt")]
    assert "checkpoint_last.pt" in names and all(
        checkpoint_problem(os.path.join(save, n)) is None for n in names
    )
    stopped_at = chaos.load(os.path.join(save, "checkpoint_last.pt"))["extra_state"]["num_updates"]
    assert stopped_at >= refused_at + 2, (refused_at, stopped_at)
    assert "Free disk space" not in first.output()
    assert not [n for n in os.listdir(save) if n.startswith(".")]
    assert not os.path.exists(os.path.join(save, LOCK_NAME))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill9_then_same_command_takes_over_and_resumes(tmp_path):
    chaos = load_script("dev/chaos_resume")
    data = chaos.make_databin(str(tmp_path / "data"))
    save = str(tmp_path / "ck")
    run = _run(chaos, data, save, 20)
    deadline = time.monotonic() + 180
    while chaos.saved_updates(save) in (None, 0) and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.05)
    assert run.kill_after(0, after_training_starts=False), run.output()
    killed_at = chaos.saved_updates(save)
    assert killed_at is not None and killed_at < 20
    assert os.path.exists(os.path.join(save, LOCK_NAME))  # left behind by the killed run
    again = _run(chaos, data, save, 20)
    assert again.wait(timeout=240) == 0, again.output()
    out = again.output()
    assert "taking over the stale lock" in out and "is not running" in out, out
    assert "Loaded checkpoint" in out, out
    assert chaos.load(os.path.join(save, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 20
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


# ------------------------------------------------------------------------------------- hostile or damaged locks
def test_lock_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A FIFO at the lock's name used to hang start-up in open(); a folder or a symbolic link is no lock either.
    Each is refused with one line naming the lock, promptly, and left as it was."""
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(dict(host="elsewhere", pid=1, started=0, heartbeat=0)))
    makers = {
        "a FIFO": lambda p: os.mkfifo(p),
        "a folder": lambda p: os.mkdir(p),
        "a symbolic link": lambda p: os.symlink(target, p),
    }
    for kind, make in makers.items():
        folder = tmp_path / kind.replace(" ", "_")
        folder.mkdir()
        lock_path = folder / LOCK_NAME
        make(str(lock_path))
        before = os.lstat(lock_path)
        started = time.monotonic()
        with pytest.raises(SeqtrainError) as e:
            SaveDirLock(str(folder)).acquire()
        assert time.monotonic() - started < 5, kind
        assert str(e.value) == (
            f"--save-dir {folder}: the lock {lock_path} is {kind}, not a regular file as seqtrain writes it; "
            "remove it (no training run made it) or use another --save-dir"
        )
        after = os.lstat(lock_path)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), kind
        assert sorted(os.listdir(folder)) == [LOCK_NAME], kind  # no temporary record left
    assert json.loads(target.read_text())["host"] == "elsewhere"  # the link's target untouched


GARBAGE = {
    # pid 0 and -1: os.kill(0 or -1, 0) succeeds (our group, every process), so these were "in use" forever
    "pid -1": (dict(pid=-1), "pid -1 is not a process number"),
    "pid 0": (dict(pid=0), "pid 0 is not a process number"),
    "pid huge": (dict(pid=10**30), "pid 1000000000000000000000000000000 is not a process number"),
    "pid float": (dict(pid=3.5), "pid 3.5 is not a process number"),
    "pid text": (dict(pid="12"), "pid '12' is not a process number"),
    "host list": (dict(host=[1]), "host [1] is not a host name"),
    "proc_start text": (dict(proc_start="x"), "proc_start 'x' is not a process start time"),
    "started text": (dict(started="abc"), "started 'abc' is not a time"),
    "started nan": (dict(started=float("nan")), "started nan is not a time"),
    "started huge": (dict(started=1e300), "started 1e+300 is in the future"),
    "heartbeat future": (dict(host="node7", heartbeat=time.time() + 10**9), "is in the future"),
    "heartbeat text": (dict(host="node7", heartbeat="soon"), "heartbeat 'soon' is not a time"),
    "heartbeat negative": (dict(host="node7", heartbeat=-1e300), "heartbeat -1e+300 is before 1970"),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_record_taken_over_with_a_log_line(tmp_path, caplog, name):
    """Values no run writes are garbage: the lock is taken over at once with one warning saying why (they used
    to give tracebacks, or be reported as a live run)."""
    change, why = GARBAGE[name]
    record = dict(host=socket.gethostname(), pid=os.getppid(), started=0, heartbeat=time.time())
    record.update(change)
    _write_owner(str(tmp_path), **record)
    lock = SaveDirLock(str(tmp_path))
    with caplog.at_level("WARNING", logger="seqtrain.savedir_lock"):
        lock.acquire()
    try:
        assert json.load(open(tmp_path / LOCK_NAME))["run_id"] == lock.record["run_id"]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and warnings[0].startswith(
            f"taking over the stale lock of {tmp_path} (garbage lock file: "
        ), warnings
        assert why in warnings[0], warnings
    finally:
        lock.release()


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 100000, b" " * 70000])
def test_unreadable_lock_taken_over_at_once(tmp_path, caplog, content):
    """A lock that is no JSON record used to count as a live run for 10 minutes after its last change."""
    (tmp_path / LOCK_NAME).write_bytes(content)
    lock = SaveDirLock(str(tmp_path))
    with caplog.at_level("WARNING", logger="seqtrain.savedir_lock"):
        lock.acquire()
    lock.release()
    assert [r.getMessage() for r in caplog.records] == [
        f"taking over the stale lock of {tmp_path} (garbage lock file: not a JSON record of a run)"
    ]
