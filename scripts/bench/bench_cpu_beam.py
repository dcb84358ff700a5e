#!/usr/bin/env python
"""A/B of CPU beam-search levers inside the decoding step: CPU seconds per batch and identical hypotheses.

The model, batches and search are profile_beam_search.py's (bart_small shape with peaked random weights, the
quickstart's search: beam 4, max-len-b 30, no-repeat-ngram 3; batches of 32 random 48-token sources; one thread).
Each variant runs in its own process, the variants alternated round by round (A B A B ...), so a shared machine's
load falls on all of them alike. Each process first decodes every batch once (warm-up; for static-compile this
is where the compiling happens, its CPU and wall time are reported), then times the same batches again: CPU time
(time.process_time) per batch, median over rounds. The first variant is the reference: the table gives each
variant's speed against it, the share of sentences whose best hypothesis is token-for-token identical, and the
largest score difference.

The library is not changed: the levers that did not pay are kept here, as patches, so the figures in
docs/benchmarks.md ("CPU beam search: levers measured") can be rerun.
  eager           seqtrain's default CPU loop
  transposed      the eager loop, its output projection x @ W with W transposed once to C x V (MKL's sgemm
                  reads a row-major K x N operand instead of x @ W.T)
  mkl             the eager loop, its output projection MKL's packed sgemm (torch.ops.mkl._mkl_linear, the
                  weight packed once)
  static          --static-decoding (fixed shapes, run eagerly on the CPU)
  static-compile  --static-decoding with its step under torch.compile (inductor's C++ backend)

    PYTHONPATH=. python scripts/bench/bench_cpu_beam.py                             # eager vs transposed vs mkl
    PYTHONPATH=. python scripts/bench/bench_cpu_beam.py --variants eager,static,static-compile --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import profile_beam_search as pbs  # noqa: E402  (the model, batches, search and their flags)

VARIANTS = ("eager", "transposed", "mkl", "static", "static-compile")


def _patch_output_layer(kind: str) -> None:
    """BartDecoder.output_layer through a weight prepared once per process (the weights never change here)."""
    import torch

    from seqtrain.models import bart

    prepared: dict[int, Any] = {}

    def output_layer(self: Any, x: Any) -> Any:
        w = self.output_projection.weight
        x2 = x.reshape(-1, x.size(-1))
        if kind == "transposed":
            wt = prepared.setdefault(w.data_ptr(), w.t().contiguous())
            y = torch.mm(x2, wt)
        else:
            packed = prepared.setdefault(
                w.data_ptr(), torch.ops.mkl._mkl_reorder_linear_weight(w, x2.size(0))
            )
            y = torch.ops.mkl._mkl_linear(x2, packed, w, None, x2.size(0))
        return y.view(*x.shape[:-1], -1)

    bart.BartDecoder.output_layer = output_layer


def child(args: argparse.Namespace) -> None:
    import torch

    from seqtrain.generation import static_decoding

    torch.set_num_threads(args.threads)
    args.static = args.variant.startswith("static")
    if args.variant in ("transposed", "mkl"):
        _patch_output_layer(args.variant)
    if args.variant == "static-compile":
        compiled = torch.compile(static_decoding.StaticStep.__call__, dynamic=False)
        static_decoding.StaticStep.__call__ = lambda self, buf: compiled(self, buf)
    _, batches, gen = pbs.build(args)
    with torch.inference_mode():
        c0, w0 = time.process_time(), time.perf_counter()
        for b in batches:  # warm-up: every batch's shapes once (static-compile compiles here)
            gen.generate(b)
        warm = (time.process_time() - c0, time.perf_counter() - w0)
        c0 = time.process_time()
        hyps = [h[0] for b in batches for h in gen.generate(b)]
        cpu = (time.process_time() - c0) / len(batches)
    out = {
        "cpu": cpu,
        "warm": warm,
        "tokens": [h["tokens"].tolist() for h in hyps],
        "scores": [float(h["score"]) for h in hyps],
    }
    with open(args.out, "w") as f:
        json.dump(out, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants", default="eager,transposed,mkl", help=f"comma-separated, from {', '.join(VARIANTS)}"
    )
    p.add_argument("--rounds", type=int, default=5)
    shared = pbs.add_setup_args(p)  # passed on to the children
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return child(args)
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    passed = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in shared]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=REPO)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                out = os.path.join(tmp, f"{v}.json")
                cmd = [sys.executable, __file__, *passed, "--variant", v, "--out", out]
                subprocess.run(cmd, check=True, env=env)
                with open(out) as f:
                    runs[v].append(json.load(f))
    from bench_packing import git_commit

    ref = runs[variants[0]][0]
    base = statistics.median(x["cpu"] for x in runs[variants[0]])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {args.threads} thread(s); commit {git_commit()}; "
        f"load avg {os.getloadavg()[0]:.1f}; batch {args.batch} x "
        f"{args.src_len}-token sources, {args.batches} batches, beam {args.beam}, max-len-b {args.max_len_b}, "
        f"no-repeat-ngram {args.ngram}; {args.rounds} alternated rounds"
    )
    print(
        "\n| variant | CPU s/batch (median) | min-max | speed vs first | identical hypotheses | max score diff "
        "| warm-up CPU s / wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        cpus = [x["cpu"] for x in runs[v]]
        med = statistics.median(cpus)
        last = runs[v][-1]
        same = sum(a == b for a, b in zip(last["tokens"], ref["tokens"]))
        diff = max(abs(a - b) for a, b in zip(last["scores"], ref["scores"]))
        print(
            f"| {v} | {med:.3f} | {min(cpus):.3f}-{max(cpus):.3f} | {base / med:.3f}x | "
            f"{same}/{len(ref['tokens'])} | {diff:.2e} | {last['warm'][0]:.1f} / {last['warm'][1]:.1f} |"
        )


if __name__ == "__main__":
    main()
