"""Reliability, round three (issue 31): SIGTERM and SIGINT sent to the whole process group, as a scheduler or a
terminal sends them, reach the worker processes too. The workers leave them to the main process, which stops
training with its checkpoint (143 / 130) or ends preprocessing with nothing half-written; before, a DataLoader
worker died of the SIGTERM and took the run down with a traceback, and no checkpoint was saved."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from seqtrain.checkpoint import load_checkpoint_file
from seqtrain_cli.train import train_main
from tests.utils import REPO, assert_same_state

MAX_UPDATE = 24  # 6 epochs: the resumed run crosses epoch ends and validations; the signals come by update 5
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|WARNING|ERROR) \| ")


@pytest.fixture(scope="module")
def databin(toy_databin):
    return toy_databin(
        n_train=120, n_valid=16
    )  # 4 updates an epoch at --max-tokens 256, validation after each


def targs(data: str, save_dir: str, workers: int) -> list[str]:
    return [
        data,
        "--arch",
        "bart_tiny",
        "--encoder-layers",
        "1",
        "--decoder-layers",
        "1",
        "--cpu",
        "--seed",
        "5",
        "--lr",
        "3e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "3",
        "--max-tokens",
        "256",
        "--criterion",
        "cross_entropy",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--max-update",
        str(MAX_UPDATE),
        "--num-workers",
        str(workers),
    ]


@pytest.fixture(scope="module")
def uninterrupted(databin, tmp_path_factory):
    save_dir = str(tmp_path_factory.mktemp("full"))
    assert train_main(targs(databin, save_dir, workers=0)) == 0
    return load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))


def group_ends(pgid: int, timeout: float = 20) -> bool:
    """Every process of the group `pgid` has exited (no worker lives on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def signal_group_when(cmd: list[str], trigger: str, signum: int, err_path: str) -> tuple[int, list[str], str]:
    """Start `cmd` as its own process group (session) and send `signum` to the whole group once a line of its
    log (stdout) contains `trigger`; returns (exit code, log lines, stderr), stderr written to `err_path`."""
    with open(err_path, "w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        lines: list[str] = []
        try:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if trigger in line:
                    os.killpg(proc.pid, signum)
                    break
            lines += proc.stdout.read().splitlines()
            rc = proc.wait(120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert group_ends(proc.pid), "a worker process outlived the run"
        err.seek(0)
        return rc, lines, err.read()


def not_log_lines(lines: list[str]) -> list[str]:
    """What is neither a log record nor the model's printout (indented, or its closing parenthesis)."""
    return [ln for ln in lines if ln and not LOG_RECORD.match(ln) and not ln.startswith((" ", ")"))]


# The moments: as training begins (its data workers just forked), mid-epoch once updates are logged, and inside
# a validation; every --num-workers. The update each run stops after depends on timing; checked is
# what the run says and saves at that update, and that the same command then ends bitwise where an
# uninterrupted run ends.
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "trigger,workers,signum",
    [
        ("Start iterating over samples", 2, signal.SIGTERM),
        ("num_updates=1,", 1, signal.SIGTERM),
        ('begin validation on "valid"', 2, signal.SIGTERM),
        ("num_updates=1,", 0, signal.SIGTERM),
        ("num_updates=1,", 2, signal.SIGINT),
    ],
    ids=[
        "sigterm-start-2-workers",
        "sigterm-mid-epoch-1-worker",
        "sigterm-validation-2-workers",
        "sigterm-mid-epoch-no-workers",
        "sigint-mid-epoch-2-workers",
    ],
)
def test_a_signal_to_the_process_group_stops_training_with_its_checkpoint(
    databin, uninterrupted, tmp_path, trigger, workers, signum
):
    save_dir = str(tmp_path / "ck")
    argv = targs(databin, save_dir, workers)
    cmd = [sys.executable, "-m", "seqtrain_cli.train", *argv]
    rc, lines, err = signal_group_when(cmd, trigger, signum, str(tmp_path / "stderr.txt"))
    name = signal.Signals(signum).name
    assert (rc, err) == (128 + signum, ""), err[-3000:]  # before: 1, and a worker's 90-line traceback
    assert not_log_lines(lines) == [], "\n".join(lines[-30:])
    warnings = [ln for ln in lines if " | WARNING | " in ln or " | ERROR | " in ln]
    assert len(warnings) == 1 and f"stopped by {name} after update " in warnings[0], warnings
    n = int(warnings[0].split("after update ")[1].split(":")[0])
    assert n < MAX_UPDATE
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if n == 0:  # stopped before the first update: nothing to keep
        assert "nothing saved" in warnings[0] and not os.path.exists(last)
    else:
        assert f"saved {last} (epoch " in warnings[0]
        assert f"run the same command to continue (exit code {128 + signum})" in warnings[0]
        assert load_checkpoint_file(last)["extra_state"]["num_updates"] == n
    assert train_main(argv) == 0  # the same command continues
    assert_same_state(uninterrupted, load_checkpoint_file(last))


# ---------------------------------------------------------------------------------------------- preprocess
def _write_pair(raw, n: int) -> None:
    raw.mkdir(exist_ok=True)
    words = [f"w{i}" for i in range(50)]
    (raw / "train.src").write_text((" ".join(words[:20]) + "\n") * n)
    (raw / "train.tgt").write_text((" ".join(words[20:30]) + "\n") * n)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_signal_to_the_process_group_ends_preprocessing_with_workers(tmp_path):
    """`--workers 2`: the signal reaches the pool workers too; they leave it to the main process, which ends
    them (SIGKILL) and removes its work folder: one line, 143 (130 for SIGINT), --destdir as it was, no process
    left. At moments from the first dictionary counts to binarizing (the whole run takes about 10 s)."""
    raw, dest = tmp_path / "raw", tmp_path / "bin"
    _write_pair(raw, 400_000)
    cmd = [sys.executable, "-m", "seqtrain_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt"]
    cmd += ["--trainpref", str(raw / "train"), "--destdir", str(dest), "--workers", "2"]
    cmd += ["--tokenizer", "none", "--joined-dictionary", "--no-progress-bar"]
    for delay, signum in (
        (0.0, signal.SIGTERM),
        (1.0, signal.SIGTERM),
        (3.0, signal.SIGTERM),
        (1.0, signal.SIGINT),
    ):
        dest.mkdir()
        (dest / "notes.txt").write_text("mine")  # what --destdir held before stays as it was
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while (
            not [n for n in os.listdir(dest) if n.startswith(".preprocess-")] and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        time.sleep(delay)
        assert proc.poll() is None, proc.stderr.read()
        os.killpg(proc.pid, signum)
        sent = time.monotonic()
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        took = time.monotonic() - sent
        assert group_ends(proc.pid, timeout=10), "a pool worker outlived the run"
        expected = (
            f"seqtrain-preprocess: stopped by SIGTERM; nothing was written to --destdir {dest} (exit code 143)"
            if signum == signal.SIGTERM
            else "seqtrain-preprocess: interrupted"
        )
        assert (proc.returncode, err.splitlines()) == (128 + signum, [expected]), (delay, err)
        assert os.listdir(dest) == ["notes.txt"] and took < 10, (delay, os.listdir(dest), took)
        (dest / "notes.txt").unlink()
        dest.rmdir()


def test_pool_workers_ignore_stop_signals_and_terminate_kills_them():
    """The pools' workers ignore SIGTERM and SIGINT from the start; terminate() ends busy ones (SIGKILL)."""
    from seqtrain.workers import child_pool

    pool = child_pool(2)
    try:
        assert pool.map(_handlers, range(2)) == [(signal.SIG_IGN, signal.SIG_IGN)] * 2
        pids = {p.pid for p in pool._pool}
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        assert pool.map(_handlers, range(4), chunksize=1) and all(_alive(pid) for pid in pids)
        busy = pool.map_async(time.sleep, [60, 60], chunksize=1)
        time.sleep(0.5)
    finally:
        t0 = time.monotonic()
        pool.terminate()
        pool.join()
    assert not busy.ready() and time.monotonic() - t0 < 10
    assert not any(_alive(pid) for pid in pids)


def _handlers(_: int) -> tuple:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie awaiting its parent's wait() counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_while_the_data_bin_is_moved_into_place_acts_once_it_is_whole(
    tmp_path, monkeypatch, python_sigint, signum
):
    """The finished files are moved into --destdir one by one; a signal that arrives meanwhile waits until the
    last one (preprocess.json) is there, so a stopped run never leaves half a data-bin."""
    from seqtrain import fileio
    from seqtrain.errors import Stopped
    from seqtrain_cli.preprocess import preprocess_main

    raw, dest = tmp_path / "raw", tmp_path / "bin"
    _write_pair(raw, 50)
    real, moved = fileio.publish, []

    def publish(tmp, path):
        moved.append(os.path.basename(path))
        if len(moved) == 1:
            signal.raise_signal(signum)  # as the first file moves
        real(tmp, path)

    monkeypatch.setattr(fileio, "publish", publish)
    argv = ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", str(raw / "train"), "--destdir"]
    argv += [str(dest), "--tokenizer", "none", "--joined-dictionary", "--no-progress-bar"]
    with pytest.raises(Stopped if signum == signal.SIGTERM else KeyboardInterrupt) as e:
        preprocess_main(argv)
    if signum == signal.SIGTERM:
        assert e.value.code == 143
        assert e.value.message == f"stopped by SIGTERM; the data-bin in {dest} is whole (exit code 143)"
    assert len(moved) > 3 and moved[-1] == "preprocess.json" and sorted(os.listdir(dest)) == sorted(moved)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_sigterm_before_the_work_begins_is_one_line():
    """seqtrain-preprocess and seqtrain-score install their SIGTERM handlers with their work; before that (parsing,
    importing the program) a SIGTERM is one line and 143 too, not a silent kill."""
    code = (
        "import os, signal, sys\n"
        "from seqtrain_cli._main import run_cli\n"
        "sys.argv = ['seqtrain-preprocess']\n"
        "run_cli('seqtrain-preprocess', lambda a: os.kill(os.getpid(), signal.SIGTERM) or signal.pause(), "
        "stop_early=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143
    assert done.stderr == "seqtrain-preprocess: stopped by SIGTERM before any work; nothing was written\n"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_signal_while_the_console_script_is_still_importing_is_one_line(tmp_path):
    """Ctrl-C (or SIGTERM) to the group while seqtrain-preprocess --workers 2 is still importing torch and the
    tokenizer libraries (its first seconds on a loaded machine): one line and 130 / 143, through the installed
    console script and `python -m` alike. Before (issue 40), a KeyboardInterrupt traceback from inside an import,
    exit -2 (every moment up to ~1.4 s measured under load)."""
    raw, dest = tmp_path / "raw", tmp_path / "bin"
    _write_pair(raw, 100_000)
    flags = ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", str(raw / "train")]
    flags += ["--destdir", str(dest), "--workers", "2", "--tokenizer", "none", "--no-progress-bar"]
    script = os.path.join(os.path.dirname(sys.executable), "seqtrain-preprocess")
    launchers = [[sys.executable, "-m", "seqtrain_cli.preprocess"]]
    launchers += [[script]] if os.path.exists(script) else []
    for cmd in launchers:
        # (not within Python's own start-up, ~0.05 s, before any seqtrain code runs: that stays Python's)
        for delay, signum in ((0.4, signal.SIGINT), (1.0, signal.SIGINT), (0.4, signal.SIGTERM)):
            proc = subprocess.Popen(
                cmd + flags, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
            )  # fmt: skip
            time.sleep(delay)
            assert proc.poll() is None, proc.stderr.read()
            os.killpg(proc.pid, signum)
            try:
                _, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            assert group_ends(proc.pid, timeout=10)
            expected = (
                "seqtrain-preprocess: interrupted"
                if signum == signal.SIGINT
                else "seqtrain-preprocess: stopped by SIGTERM before any work; nothing was written"
            )
            lines = err.splitlines()
            if signum == signal.SIGTERM and lines and "nothing was written to --destdir" in lines[0]:
                expected = lines[0]  # the import was over on this machine: the work folder's line, as above
            assert (proc.returncode, lines) == (128 + signum, [expected]), (cmd, delay, err)
            assert not dest.exists() or os.listdir(dest) == []
