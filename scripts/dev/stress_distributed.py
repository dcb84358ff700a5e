#!/usr/bin/env python
"""Run the distributed tests again and again, idle or with every core loaded, and count passes in a row.

    .venv/bin/python scripts/dev/stress_distributed.py --runs 50                 # idle machine
    .venv/bin/python scripts/dev/stress_distributed.py --runs 50 --load 2        # two busy loops beside it

Each run is one pytest process over --tests (default tests/e2e/test_distributed.py). A run fails when pytest
fails or when its output shows a process that ended abnormally at teardown (SIGABRT, "terminate called",
a core dump), even if pytest itself passed. --load N starts N busy processes (plain Python loops at normal
priority) for the whole session. Prints one line per run and a table at the end; --log FILE appends the
table (markdown) to FILE. Exit status 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABNORMAL = re.compile(r"SIGABRT|terminate called|Aborted \(core dumped\)|core dumped|Fatal Python error")


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--load", type=int, default=0, help="busy processes to run beside the tests")
    p.add_argument("--tests", nargs="+", default=["tests/e2e/test_distributed.py"])
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first failed run")
    p.add_argument("--log", default=None, help="append the summary table to this file")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    loads = busy_loops(args.load)
    results: list[tuple[int, bool, float, str]] = []
    streak = best = 0
    try:
        for k in range(1, args.runs + 1):
            start = time.perf_counter()
            cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args.tests]
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            out = proc.stdout + proc.stderr
            abnormal = ABNORMAL.search(out)
            ok = proc.returncode == 0 and abnormal is None
            summary = next(
                (line for line in reversed(out.splitlines()) if " in " in line and "passed" in line), ""
            )
            why = "" if ok else (abnormal.group(0) if abnormal else f"pytest exit {proc.returncode}")
            streak = streak + 1 if ok else 0
            best = max(best, streak)
            results.append((k, ok, seconds, why))
            print(
                f"run {k}: {'passed' if ok else 'FAILED (' + why + ')'} in {seconds:.0f} s, load "
                f"{os.getloadavg()[0]:.1f}; {summary.strip('= ')}",
                flush=True,
            )
            if not ok:
                print(out[-4000:], flush=True)
                if not args.keep_going:
                    break
    finally:
        for proc in loads:
            proc.kill()
    passed = sum(ok for _, ok, _, _ in results)
    times = sorted(s for _, _, s, _ in results)
    failures = "; ".join(f"run {k}: {w}" for k, ok, _, w in results if not ok) or "-"
    table = "\n".join(
        [
            "| tests | busy loops | runs | passed | longest run of passes | median s per run | failures |",
            "|---|---|---|---|---|---|---|",
            f"| {' '.join(args.tests)} | {args.load} | {len(results)} | {passed} | {best} | "
            f"{times[len(times) // 2]:.0f} | {failures} |",
        ]
    )
    print(table)
    if args.log:
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(table + "\n")
    return 0 if passed == len(results) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
