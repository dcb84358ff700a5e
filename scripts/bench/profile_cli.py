#!/usr/bin/env python
"""Run a command-line module under torch.profiler and print where its CPU time went.

    python scripts/bench/profile_cli.py --out prof.txt -- seqtrain_cli.train DATA-BIN --arch bart_base ...
    $FAIRSEQ_PEER/bin/python scripts/bench/profile_cli.py --out prof.txt -- fairseq_cli.train DATA-BIN ...

Needs only the standard library and torch, so the same file profiles fairseq inside its own venv. The module
runs as `python -m MODULE ARGS` would (runpy, `__name__ == "__main__"`), in this process, with the profiler
recording CPU operators. Written to --out: a summary by kind of work (matrix products, attention kernels,
elementwise and the rest), then torch's table of operators by self CPU time. Profiling costs some speed of its
own (roughly the same per operator for both tools), so the table says where the time goes, not how fast a run is.
"""

from __future__ import annotations

import argparse
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
ATTENTION = {
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_softmax",
    "aten::_softmax_backward_data",
}


def kind(name: str) -> str:
    if name in MATMUL:
        return "matrix products"
    if name in ATTENTION:
        return "attention kernels / softmax"
    if "adam" in name.lower() or "Optimizer" in name or name.startswith("aten::_foreach"):
        return "optimizer"
    if name.startswith("aten::"):
        return "other aten operators"
    return "other (python-level ranges)"


def summary(events) -> str:
    """Self CPU time by kind of operator, as a markdown table."""
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind(e.key)] = by_kind.get(kind(e.key), 0.0) + e.self_cpu_time_total
    lines = ["| kind | self CPU s | share |", "|---|---|---|"]
    for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {k} | {v / 1e6:.2f} | {100 * v / total:.1f}% |")
    return "\n".join(lines)


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print("usage: profile_cli.py [--out FILE] [--rows N] -- MODULE [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--rows", type=int, default=30)
    args = p.parse_args(argv[:split])
    module, *rest = argv[split + 1 :]
    sys.argv = [module, *rest]
    code = 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    events = prof.key_averages()
    text = (
        f"# {module} {' '.join(rest)}\n# torch {torch.__version__}, {torch.get_num_threads()} threads\n\n"
        f"{summary(events)}\n\n{events.table(sort_by='self_cpu_time_total', row_limit=args.rows)}\n"
    )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
