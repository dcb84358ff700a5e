"""The quickstart's training on a busy machine: how much slower it gets with k other CPU-bound processes beside
it, at torch's default intra-op threads and at the count seqtrain chooses for that load (issue 41 item 2).

Each row trains --updates updates of the quickstart's fine-tuning (configs/debdesc_small.yaml from
models/debdesc-small-denoising on the quickstart's data-bin; no validation, no checkpoints) in a fresh
seqtrain-train process while k busy-looping processes run, and reads the run's own "done training in S seconds".
The load a real run sees is steady, so its 1-minute load average has caught up before it starts; here the
burners start seconds before each run, so the chosen row sets OMP_NUM_THREADS to what
seqtrain.host_cpu.choose_threads picks at load k (the probe itself is tested in tests/unit/train).

    scripts/quickstart.sh    # makes .quickstart/data-bin
    PYTHONPATH=. python scripts/bench/bench_busy.py --busy 0,1,2,4 --updates 40

Read the slowdown column against the idle row; with k CPU-bound processes on c cores a single run's fair share
is at best c / (k + 1) of the machine, so no thread count keeps it within 1.5x of idle once k >= 2 on 2 cores.
The idle row at one thread measures what one core gives: a one-thread run beside k busy processes can at best
take max(1, (k + 1) / c) times that (the last column).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from seqtrain.host_cpu import choose_threads, usable_cpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DONE = re.compile(r"done training in ([0-9.]+) seconds")


def burners(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def train_seconds(data: str, updates: int, threads: int | None) -> float:
    """Seconds one fresh seqtrain-train process takes for `updates` updates: its own "done training in" (the
    trainer's cumulative training time, as fairseq logs it; not the imports)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    save = tempfile.mkdtemp(prefix="bench_busy_")
    try:
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "seqtrain-train"),
            data,
            "--config",
            os.path.join(ROOT, "configs", "debdesc_small.yaml"),
            "--finetune-from-model",
            os.path.join(ROOT, "models", "debdesc-small-denoising"),
            "--lr",
            "0.0005",
            "--warmup-updates",
            "60",
            "--max-update",
            str(updates),
            "--disable-validation",
            "--no-save",
            "--save-dir",
            save,
            "--log-format",
            "simple",
            "--log-interval",
            "1000",
        ]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        found = DONE.findall(run.stdout + run.stderr)
        if run.returncode != 0 or not found:
            raise SystemExit(f"bench_busy: seqtrain-train failed ({run.returncode}):\n{run.stderr[-2000:]}")
        return float(found[-1])
    finally:
        shutil.rmtree(save, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, ".quickstart", "data-bin"))
    ap.add_argument("--busy", default="0,1,2,4", help="counts of busy processes beside the run")
    ap.add_argument("--updates", type=int, default=40)
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.data, "dict.source.txt")):
        raise SystemExit(f"bench_busy: {args.data}: no data-bin there (run scripts/quickstart.sh first)")
    cpus = usable_cpus()
    default = torch.get_num_threads()
    print(f"# {cpus} usable CPUs, torch's default {default} threads, {args.updates} updates a row")
    print("| busy processes | threads | s | updates/s | vs idle | vs a one-thread run's fair-share bound |")
    print("|---:|---|---:|---:|---:|---:|")
    idle = one = None
    for k in (int(x) for x in args.busy.split(",")):
        chosen = choose_threads(cpus, float(k))
        modes = [("torch's default", default)] + (
            [("seqtrain's choice", chosen)] if chosen != default else []
        )
        if k == 0 and default != 1:
            modes.append(("one thread", 1))  # what one core gives: the bound's unit
        procs = burners(k)
        try:
            time.sleep(1.0 if k else 0.0)
            for name, threads in modes:
                s = train_seconds(args.data, args.updates, threads)
                idle = idle if idle is not None else s
                if k == 0 and threads == 1:
                    one = s
                # k CPU-bound processes and this run's one thread share `cpus` cores: at best max(1, (k+1)/cpus)
                # of one thread's idle time
                bound = one * max(1.0, (k + 1) / cpus) if one is not None and threads == 1 else None
                vs_bound = f"{s / bound:.2f}x" if bound else "-"
                print(
                    f"| {k} | {name}: {threads} | {s:.1f} | {args.updates / s:.2f} | {s / idle:.2f}x | {vs_bound} |",
                    flush=True,
                )
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
