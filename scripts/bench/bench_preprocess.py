#!/usr/bin/env python
"""Benchmark seqtrain-preprocess: throughput and peak memory with 1 and 2 (or --workers ...) workers.

Each run is a fresh `python -m seqtrain_cli.preprocess` process; a poller reads /proc every 20 ms and records the
peak RSS of the biggest single process and the peak PSS of the whole process tree (main + workers together).
The sentencepiece model is trained once first (timed on its own) and then given with --spm-model, so the table
compares what --workers changes: tokenizing, counting and binarizing. The outputs of all runs must be
byte-identical; the script checks that too.

    python scripts/bench/bench_preprocess.py                       # full debdesc train split in ../shared
    python scripts/bench/bench_preprocess.py --trainpref data/debdesc-sample/train --workers 1 2 4
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    return kids


def _rss_pss(pid: int) -> tuple[int, int]:
    """Resident set size and proportional set size (shared pages split among the processes sharing them)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
        with open(f"/proc/{pid}/smaps_rollup") as f:
            pss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        return rss, pss
    except (OSError, IndexError, ValueError, StopIteration):
        return 0, 0


def run_measured(cmd: list[str]) -> tuple[float, int, int]:
    """Run cmd; return (wall seconds, peak RSS of one process, peak PSS of the process tree), in bytes.

    Forked workers share the parent's pages, so summing RSS would count those pages once per process; PSS
    splits each shared page among its sharers, so the tree's sum is the memory the run really holds."""
    peak_one = peak_tree = 0
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = threading.Event()

    def poll() -> None:
        nonlocal peak_one, peak_tree
        while not done.is_set():
            kids = _children()
            tree, todo = [], [proc.pid]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(kids.get(pid, []))
            sizes = [_rss_pss(p) for p in tree]
            peak_one = max(peak_one, max(rss for rss, _ in sizes))
            peak_tree = max(peak_tree, sum(pss for _, pss in sizes))
            done.wait(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    t.join()
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err.decode(errors='replace')}")
    return wall, peak_one, peak_tree


def digest(folder: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith((".bin", ".idx", ".txt")) or name == "spm.model":
            h.update(name.encode())
            with open(os.path.join(folder, name), "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainpref", default=os.path.join(REPO, "..", "shared", "data", "debdesc", "train"))
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--spm-vocab-size", type=int, default=8000)
    args = p.parse_args()
    src = args.trainpref + ".source"
    if not os.path.exists(src):
        sys.exit(f"{src} not found (the full corpus lives in ../shared; pass --trainpref)")
    with open(src, "rb") as f:
        n_lines = sum(1 for _ in f)
    mib = (os.path.getsize(src) + os.path.getsize(args.trainpref + ".target")) / 2**20
    py = [sys.executable, "-m", "seqtrain_cli.preprocess", "--trainpref", args.trainpref, "--no-progress-bar"]

    with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
        first = os.path.join(tmp, "spm")
        wall, one, tree = run_measured(
            py + ["--destdir", first, "--dict-only", "--spm-vocab-size", str(args.spm_vocab_size)]
        )
        print(f"input: {args.trainpref}.{{source,target}}: {n_lines:,} line pairs, {mib:.1f} MiB")
        print(
            f"sentencepiece training + dictionaries (--dict-only, spm {args.spm_vocab_size}): {wall:.1f} s, "
            f"peak RSS {one / 2**20:.0f} MiB\n"
        )
        rows = []
        for w in args.workers:
            out = os.path.join(tmp, f"w{w}")
            wall, one, tree = run_measured(
                py + ["--destdir", out, "--workers", str(w), "--spm-model", os.path.join(first, "spm.model")]
            )
            rows.append((w, wall, n_lines / wall, one, tree, digest(out)))
        print(
            "| workers | wall s | line pairs/s | peak RSS, largest process | peak PSS, all processes | output sha256 |"
        )
        print("|---:|---:|---:|---:|---:|---|")
        for w, wall, rate, one, tree, dig in rows:
            print(
                f"| {w} | {wall:.1f} | {rate:,.0f} | {one / 2**20:.0f} MiB | {tree / 2**20:.0f} MiB | {dig} |"
            )
        same = len({r[-1] for r in rows}) == 1
        print(f"\noutputs byte-identical across worker counts: {'yes' if same else 'NO'}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
