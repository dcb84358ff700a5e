"""How long each program takes to start: `python -c "import seqtrain_cli.X"` and `seqtrain-X --help`, fresh
processes, medians. Every command pays this before any work (and so does every test that runs one).

    PYTHONPATH=. python scripts/bench/bench_startup.py --repeats 5

`import torch` alone is the floor: the programs import it at start-up (it is their work)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PROGRAMS = ("train", "generate", "preprocess", "interactive", "tune", "convert")


def seconds(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bindir = os.path.dirname(sys.executable)
    print(
        f"# {args.repeats} fresh processes each, median wall seconds; load {os.getloadavg()[0]:.1f} at start"
    )
    print("| program | import | --help |")
    print("|---|---:|---:|")
    torch_s = seconds([sys.executable, "-c", "import torch"], args.repeats)
    print(f"| (import torch alone) | {torch_s:.2f} | |")
    for p in PROGRAMS:
        imp = seconds([sys.executable, "-c", f"import seqtrain_cli.{p}"], args.repeats)
        helps = seconds([os.path.join(bindir, f"seqtrain-{p}"), "--help"], args.repeats)
        print(f"| seqtrain-{p} | {imp:.2f} | {helps:.2f} |", flush=True)


if __name__ == "__main__":
    main()
