#!/usr/bin/env python
"""Kill seqtrain-train with SIGKILL at random moments, restart the same command, and check that the run ends
bitwise equal to one never interrupted.

    python scripts/dev/chaos_resume.py [--kills 20] [--seed 0] [--max-update 240] [--workdir DIR]

One "resume" is one kill followed by a restart. Most kills come at a random moment (uniform over a few
seconds after training began: updates, validation, checkpoint writes, pruning; a quarter of them during
start-up instead: imports, data, checkpoint loading); every fourth kill is aimed at the two moments a random
kill rarely hits: half-way through writing a checkpoint's temporary file, and between writing
checkpoint_E_U.pt and linking checkpoint_last.pt to it. After the last kill the command runs to completion.
An uninterrupted run of the same command (keeping all its checkpoints) runs alongside; each resume's result
(the state the next kill found, or the final one) is compared with the reference at the same update: model
parameters, optimizer state, lr scheduler, update count, data position and best value must be equal
(torch.equal, i.e. bitwise).

Prints one line per kill and a summary "N of M resumes ended bitwise equal"; exits 1 on any difference.
tests/e2e/test_kill_anywhere.py loads this file and runs a short version.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Runs the training CLI after arranging a SIGKILL of this very process at a chosen point of the N-th
# checkpoint write (CHAOS_KILL_AT="mid-write:N" or "between-files:N"), so those moments are hit exactly.
KILL_POINT_WRAPPER = r"""
import io, os, signal, sys
where, n = os.environ["CHAOS_KILL_AT"].split(":")
n = int(n)
calls = [0]
def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
if where == "mid-write":
    import torch
    real_save = torch.save
    def save(obj, f, *a, **k):
        calls[0] += 1
        if calls[0] < n or not hasattr(f, "write"):
            return real_save(obj, f, *a, **k)
        buf = io.BytesIO()
        real_save(obj, buf, *a, **k)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        die()
    torch.save = save
elif where == "between-files":
    import seqtrain.train.checkpoints as tc
    real_link = tc.link_or_copy
    def link(src, dst):
        calls[0] += 1
        if calls[0] >= n:
            die()
        return real_link(src, dst)
    tc.link_or_copy = link
from seqtrain_cli.train import cli_main
cli_main(sys.argv[1:])
"""

START_LINE = "Start iterating over samples"


def make_databin(folder: str, n_train: int = 160, n_valid: int = 24, seed: int = 0) -> str:
    """A toy copy-and-reverse data-bin (the target is the first 4 source words, reversed)."""
    from seqtrain_cli.preprocess import preprocess_main as preprocess

    r = random.Random(seed)
    raw = os.path.join(folder, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        with open(f"{raw}/{split}.src", "w") as fs, open(f"{raw}/{split}.tgt", "w") as ft:
            for _ in range(n):
                toks = [f"w{r.randrange(30)}" for _ in range(r.randint(4, 9))]
                fs.write(" ".join(toks) + "\n")
                ft.write(" ".join(reversed(toks[:4])) + "\n")
    dest = os.path.join(folder, "bin")
    preprocess(
        [
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--trainpref",
            f"{raw}/train",
            "--validpref",
            f"{raw}/valid",
            "--destdir",
            dest,
            "--joined-dictionary",
            "--tokenizer",
            "none",
            "--no-progress-bar",
        ]
    )
    return dest


def train_args(data: str, save_dir: str, max_update: int, prune: bool = True) -> list[str]:
    """Frequent interval checkpoints (every update), validation and checkpoint_best links, pruning, dropout:
    every part of the checkpoint machinery runs all the time. The reference run keeps every checkpoint
    (prune=False) so each resumed state can be compared with the reference at the same update."""
    keep = ["--keep-interval-updates", "2", "--keep-last-epochs", "1"] if prune else []
    return [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
        "--seed",
        "11",
        "--max-tokens",
        "256",
        "--encoder-layers",
        "1",
        "--decoder-layers",
        "1",
        "--optimizer",
        "adam",
        "--lr",
        "2e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "8",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-update",
        str(max_update),
        "--save-dir",
        save_dir,
        "--save-interval-updates",
        "1",
        *keep,
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--no-progress-bar",
    ]


def train_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "seqtrain-train")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "seqtrain_cli.train"]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


class Run:
    """One training process whose output is read by a thread (so the pipe never fills up)."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, cwd=REPO
        )
        self.lines: list[str] = []
        self.training = threading.Event()
        self.startup_seconds: float | None = None  # process start -> first training update begins
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if START_LINE in line and not self.training.is_set():
                self.startup_seconds = time.monotonic() - self.started
                self.training.set()
        self.training.set()  # ended: nobody should wait for training to start

    def kill_after(self, delay: float, after_training_starts: bool) -> bool:
        """SIGKILL `delay` seconds after training started (or after the process started). False if it had
        already exited."""
        if after_training_starts:
            self.training.wait()
            deadline = time.monotonic() + delay
        else:
            deadline = self.started + delay
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGKILL)
        self.wait()
        return True

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(timeout=10)
        return rc

    def output(self) -> str:
        return "".join(self.lines)


def saved_updates(save_dir: str) -> int | None:
    """The update count checkpoint_last.pt holds (None when there is none)."""
    import torch

    path = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.exists(path):
        return None
    return int(torch.load(path, map_location="cpu", weights_only=True)["extra_state"]["num_updates"])


def partial_files(save_dir: str) -> list[str]:
    return sorted(n for n in os.listdir(save_dir) if n.startswith(".")) if os.path.isdir(save_dir) else []


def load(path: str) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def reference_by_update(ref_dir: str) -> dict[int, str]:
    """update count -> a checkpoint of the reference run (interval names carry it; epoch files are opened)."""
    out: dict[int, str] = {}
    for name in sorted(os.listdir(ref_dir)):
        m = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", name)
        if m:
            out[int(m.group(1))] = os.path.join(ref_dir, name)
        elif re.fullmatch(r"checkpoint\d+\.pt", name):
            path = os.path.join(ref_dir, name)
            out.setdefault(int(load(path)["extra_state"]["num_updates"]), path)
    return out


def compare_states(a: dict, b: dict) -> list[str]:
    """Differences between two checkpoints' training state (empty when bitwise equal)."""
    import torch

    diffs = [k for k in a["model"] if k not in b["model"] or not torch.equal(a["model"][k], b["model"][k])]
    for pid, sa in a["optimizer"]["state"].items():
        sb = b["optimizer"]["state"].get(pid, {})
        diffs += [
            f"optimizer.{pid}.{k}"
            for k in sa
            if k not in sb or not torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k]))
        ]
    if a["lr_scheduler"] != b["lr_scheduler"]:
        diffs.append("lr_scheduler")
    for k in ("num_updates", "epoch", "train_iterator", "best"):
        if a["extra_state"].get(k) != b["extra_state"].get(k):
            diffs.append(f"extra_state.{k}")
    return diffs


def chaos(
    workdir: str,
    kills: int,
    seed: int,
    max_update: int,
    window: float,
    startup_share: float = 0.0,
    aimed_every: int = 4,
    log=print,
) -> tuple[list[dict], list[str], float]:
    """Kill and restart `kills` times, then finish. Random kills come uniformly in [0, window] seconds after
    training began; a `startup_share` of them instead at a uniform time during start-up (as long as the
    reference run's start-up took). Every `aimed_every`-th kill is aimed (see KILL_POINT_WRAPPER).
    Returns (one record per resume, with "equal": whether the state it led to is bitwise the reference's at the
    same update; differences of the final state; seconds)."""
    data = make_databin(os.path.join(workdir, "toy"))
    ref_dir, chaos_dir = os.path.join(workdir, "reference"), os.path.join(workdir, "chaos")
    snapshots = os.path.join(workdir, "snapshots")
    os.makedirs(snapshots)
    cmd = train_command()
    t0 = time.monotonic()
    reference = Run(cmd + train_args(data, ref_dir, max_update, prune=False), child_env())  # runs alongside
    rng = random.Random(seed)
    records: list[dict] = []
    for i in range(kills):
        aimed = None
        if aimed_every and i % aimed_every == aimed_every - 1:
            aimed = ("mid-write", "between-files")[(i // aimed_every) % 2]
        before = set(partial_files(chaos_dir))
        if aimed:
            at = rng.randint(2, 4)  # the at-th checkpoint write of this process
            run = Run(
                [sys.executable, "-c", KILL_POINT_WRAPPER] + train_args(data, chaos_dir, max_update),
                child_env({"CHAOS_KILL_AT": f"{aimed}:{at}"}),
            )
            killed = run.wait() == -signal.SIGKILL
            how = f"at {aimed} of checkpoint write {at}"
        else:
            in_startup = rng.random() < startup_share
            if in_startup:
                reference.training.wait()
                delay = rng.uniform(0.0, reference.startup_seconds or 1.0)
            else:
                delay = rng.uniform(0.0, window)
            run = Run(cmd + train_args(data, chaos_dir, max_update), child_env())
            killed = run.kill_after(delay, after_training_starts=not in_startup)
            how = f"{delay:.2f}s after {'the process started' if in_startup else 'training began'}"
        if not killed:
            if run.wait() != 0:
                raise RuntimeError(f"training failed instead of being killed:\n{run.output()[-3000:]}")
            log(f"kill {i + 1}: the run finished before the kill ({how}); no more kills")
            break
        partial = partial_files(chaos_dir)
        last = os.path.join(chaos_dir, "checkpoint_last.pt")
        snap = None
        if os.path.exists(last):
            snap = os.path.join(snapshots, f"after_kill_{i + 1}.pt")
            shutil.copyfile(last, snap)
        rec = {
            "kill": i + 1,
            "how": how,
            "snapshot": snap,
            "updates": saved_updates(chaos_dir),
            "files": sorted(n for n in os.listdir(chaos_dir) if not n.startswith(".")),
            "mid_write": any(n.endswith(".tmp") and n not in before for n in partial),
            "partial_files": partial,
        }
        records.append(rec)
        log(
            f"kill {i + 1}: {how}: checkpoint_last.pt at update {rec['updates']}"
            + (f"; the interrupted write left {', '.join(partial)}" if partial else "")
        )
    final = Run(cmd + train_args(data, chaos_dir, max_update), child_env())
    if final.wait() != 0:
        raise RuntimeError(f"the final restart failed:\n{final.output()[-3000:]}")
    if reference.wait() != 0:
        raise RuntimeError(f"the reference run failed:\n{reference.output()[-3000:]}")
    # resume k (the restart after kill k) ended in the state that kill k+1 found, or in the final one
    ref = reference_by_update(ref_dir)
    ends = [r["snapshot"] for r in records[1:]] + [os.path.join(chaos_dir, "checkpoint_last.pt")]
    for rec, end in zip(records, ends):
        if end is None:
            rec["equal"] = None  # killed before any checkpoint existed: nothing to compare yet
            continue
        state = load(end)
        u = int(state["extra_state"]["num_updates"])
        rec["equal"] = u in ref and not compare_states(load(ref[u]), state)
    diffs = compare_states(
        load(os.path.join(ref_dir, "checkpoint_last.pt")), load(os.path.join(chaos_dir, "checkpoint_last.pt"))
    )
    leftovers = partial_files(chaos_dir)
    if leftovers:
        diffs.append(f"temporary files left in the save dir: {leftovers}")
    return records, diffs, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-update", type=int, default=240)
    p.add_argument(
        "--window",
        type=float,
        default=3.0,
        help="random kill times are uniform in [0, WINDOW] seconds after training began",
    )
    p.add_argument(
        "--startup-share",
        type=float,
        default=0.25,
        help="share of random kills aimed at start-up (data, model, checkpoint loading) instead",
    )
    p.add_argument(
        "--workdir", default=None, help="keep the runs here (default: a temporary folder, removed)"
    )
    a = p.parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="seqtrain-chaos-")
    try:
        records, diffs, seconds = chaos(workdir, a.kills, a.seed, a.max_update, a.window, a.startup_share)
    finally:
        if a.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    n = len(records)
    compared = [r for r in records if r["equal"] is not None]
    equal = sum(bool(r["equal"]) for r in compared)
    mid = sum(r["mid_write"] for r in records)
    between = sum("between-files" in r["how"] for r in records)
    print(
        f"{n} kills: {mid} inside a checkpoint write, {between} between checkpoint_E_U.pt and its "
        f"checkpoint_last.pt link; checkpoint_last.pt after each kill at updates {[r['updates'] for r in records]}"
    )
    print(
        f"{equal} of {len(compared)} resumes ended bitwise equal to the uninterrupted run at the same update "
        f"({n - len(compared)} killed before a first checkpoint); final state at update {a.max_update}: "
        f"{'bitwise equal' if not diffs else 'DIFFERENT: ' + ', '.join(diffs[:8])} ({seconds:.0f} s)"
    )
    return 0 if not diffs and equal == len(compared) else 1


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
