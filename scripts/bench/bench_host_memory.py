#!/usr/bin/env python
"""Host memory of a CPU training step: glibc malloc's defaults against malloc set to keep freed memory, side by
side. Each variant runs in a fresh process (malloc's state is per process); the variants alternate.

A step frees its activations and allocates them again. glibc, left to its defaults, serves a block with its
own mmap until a freed one raises its threshold, and trims the heap top once more than twice the largest freed
block lies free there: a step may hand memory back and fault it in again, page by page. The "kept" variant sets
MALLOC_MMAP_THRESHOLD_ to 32 MiB (glibc's maximum) and MALLOC_TRIM_THRESHOLD_ to 2 GiB, so nothing is handed
back. Per variant: seconds per round, minor page faults per round, peak RSS.

A round is two training steps of different shapes, as length-bucketed batches come: 8 sentences of 240-250
source tokens, then 24 of 60-72 (20-30 and 10-20 target tokens); two rounds of warm-up first.

    .venv/bin/python scripts/bench/bench_host_memory.py                     # bart_base, about 6 minutes
    .venv/bin/python scripts/bench/bench_host_memory.py --arch bart_tiny --rounds 1 --steps 1   # plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {scripts!r})
import torch
import gpu_check_lib as lib

torch.set_num_threads({threads})
trainer, _ = lib.make_trainer(True, {arch!r}, 8008, None, "--dropout", "0.1", "--label-smoothing", "0.1")
long = lib.seqtrain_sample(lib.make_pairs(8, (240, 250), (20, 30), 8008, 0))
short = lib.seqtrain_sample(lib.make_pairs(24, (60, 72), (10, 20), 8008, 1))
for _ in range(2):
    trainer.train_step([long])
    trainer.train_step([short])
times, faults = [], []
for _ in range({steps}):
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    trainer.train_step([long])
    trainer.train_step([short])
    times.append(time.perf_counter() - t0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"s": times, "faults": faults, "rss_mb": rss_mb}}))
"""

KEPT = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
VARIANTS = [("glibc defaults", {}), ("freed memory kept", KEPT)]


def run_variant(args: argparse.Namespace, env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(env_extra)
    code = CHILD.format(
        scripts=os.path.join(ROOT, "scripts", "gpu"), threads=args.threads, arch=args.arch, steps=args.steps
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_host_memory: the {args.arch} child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--arch", default="bart_base")
    p.add_argument("--rounds", type=int, default=2, help="processes per variant, alternated")
    p.add_argument("--steps", type=int, default=4, help="timed rounds of two steps per process")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    results: dict[str, list[dict]] = {name: [] for name, _ in VARIANTS}
    for r in range(args.rounds):
        for name, env in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            res = run_variant(args, env)
            results[name].append(res)
            print(f"round {r} {name}: {json.dumps(res)}", flush=True)
    print(
        f"\n{args.arch}, {args.threads} threads, {args.rounds} processes x {args.steps} rounds of 2 steps each\n"
    )
    print(
        "| malloc | s per round (median) | page faults per round (median) | peak RSS MB | time vs defaults |"
    )
    print("|---|---|---|---|---|")
    base = None
    for name, _ in VARIANTS:
        runs = results[name]
        s = statistics.median(t for res in runs for t in res["s"])
        faults = statistics.median(f for res in runs for f in res["faults"])
        rss = max(res["rss_mb"] for res in runs)
        base = base or s
        print(f"| {name} | {s:.2f} | {faults:.0f} | {rss:.0f} | {s / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
