"""Frozen weights on the CPU: time and memory of a training update with nothing frozen, --freeze-embeddings,
--freeze-encoder and LoRA (--lora-rank 8 on q_proj,v_proj), side by side in one run.

    .venv/bin/python scripts/bench/bench_freeze.py                # bart_base, 8k vocabulary, 4 timed updates each
    .venv/bin/python scripts/bench/bench_freeze.py --arch bart_small --updates 2 --rounds 1   # a quick look

Each variant runs in a fresh process (freed memory of one variant must not serve the next), the variants alternated
over the rounds, on the same batches (16 random pairs of 200-400 source and 20-40 target tokens). Per variant:
trained parameters, optimizer state (MiB), median seconds per update, and the process's peak RSS (model, batches,
optimizer state and the largest update together).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpu"))

import gpu_check_lib as lib  # noqa: E402  (scripts/gpu/gpu_check_lib.py)
from benchlib import MIB  # noqa: E402  (scripts/bench/benchlib.py)

VARIANTS = {
    "none": (),
    "embeddings": ("--freeze-embeddings",),
    "encoder": ("--freeze-encoder",),
    "lora r8 q,v": ("--lora-rank", "8"),
}


def run(a: argparse.Namespace) -> dict:
    """One variant in this process."""
    pairs = lib.make_pairs(a.sentences * 3, (200, 400), (20, 40), a.vocab, seed=0)
    batches = [lib.seqtrain_sample(pairs[i::3]) for i in range(3)]
    trainer, _ = lib.make_trainer(True, a.arch, a.vocab, None, *VARIANTS[a.variant])
    trainer.train_step([batches[0]])  # warm-up: optimizer state allocated
    gc.collect()
    times = []
    for i in range(a.updates):
        start = time.perf_counter()
        trainer.train_step([batches[(i + 1) % len(batches)]])
        times.append(time.perf_counter() - start)
    state = trainer.optimizer.optimizer.state
    opt_bytes = sum(
        t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t)
    )
    return {
        "trained": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "opt_mib": opt_bytes / MIB,
        "s": times,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="bart_base")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--updates", type=int, default=4, help="timed updates per variant and round")
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds over the variants")
    p.add_argument("--sentences", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # (a child process)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.variant:
        print(json.dumps(run(a)))
        return
    results: dict[str, list] = {name: [] for name in VARIANTS}
    for r in range(a.rounds):
        for name in list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS)):
            argv = [sys.executable, os.path.abspath(__file__), "--variant", name]
            for flag in ("arch", "vocab", "updates", "sentences", "threads"):
                argv += [f"--{flag}", str(getattr(a, flag))]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"{a.arch}, vocabulary {a.vocab}, {a.sentences} sentences of 200-400 -> 20-40 tokens a batch, CPU, "
        f"{a.threads} threads, {a.rounds} rounds x {a.updates} updates"
    )
    print("| frozen | trained params | optimizer state MiB | s / update (median) | vs none | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(t for res in results["none"] for t in res["s"])
    for name, res in results.items():
        med = statistics.median(t for x in res for t in x["s"])
        print(
            f"| {name} | {res[0]['trained']:,} | {res[0]['opt_mib']:.0f} | {med:.3f} | {base / med:.2f}x | "
            f"{max(x['peak_mib'] for x in res):.0f} |"
        )


if __name__ == "__main__":
    main()
