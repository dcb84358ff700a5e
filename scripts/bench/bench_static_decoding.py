#!/usr/bin/env python
"""The static decoding path (--static-decoding) against the eager loop on this machine, same weights and sources.

On the CPU the static step runs without CUDA graphs, so this measures what its fixed shapes cost there: attention
over the whole key/value capacity, sources padded to a power-of-two bucket, rows in power-of-two slots, a reorder
of every buffer each step. Random peaked weights (bench_generate.peaked_random_state: hypotheses end at varied
lengths), sources of --src-len tokens; the two paths alternate which goes first per batch, medians of --rounds.
Prints a table (sentences/s, ratio, identical best hypotheses) and the machine, torch and commit.

    PYTHONPATH=. python scripts/bench/bench_static_decoding.py --shape small --batch-sizes 8,16
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))

import bench_generate as bg  # noqa: E402
from bench_packing import git_commit  # noqa: E402

from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.generation.sequence_generator import SequenceGenerator  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="small", help="bench_generate's model shapes: small, base")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch-sizes", default="8,16")
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--src-len", type=int, default=200)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-len-b", type=int, default=60)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    _, model = bg.load_pair(
        bg.peaked_random_state(args.vocab, seed=0, eos_scale=4.0, shape=args.shape), args.vocab, args.shape
    )
    d = Dictionary()
    for i in range(args.vocab - len(d)):
        d.add_symbol(f"w{i}")
    g = torch.Generator().manual_seed(11)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    n = max(sizes) * args.batches
    lengths = torch.randint(args.src_len // 2, args.src_len + 1, (n,), generator=g).tolist()
    sources = [torch.randint(4, args.vocab, (k - 1,), generator=g).tolist() + [bg.EOS] for k in lengths]
    kw = dict(
        beam_size=args.beam,
        nbest=1,
        max_len_b=args.max_len_b,
        min_len=5,
        len_penalty=2.0,
        no_repeat_ngram_size=3,
    )
    rows = []
    for bsz in sizes:
        gens = {
            name: SequenceGenerator(model, d, static_decoding=name == "static", **kw)
            for name in ("eager", "static")
        }
        batches = [
            pad
            for pad in (
                bg.pad_batch(sources[i * bsz : (i + 1) * bsz], left=True) for i in range(args.batches)
            )
        ]
        times: dict[str, list[float]] = {"eager": [], "static": []}
        outs: dict[str, list[list[int]]] = {}
        with torch.inference_mode():
            for gen in gens.values():
                gen.generate(batches[0][:2])  # warm-up
            for r in range(args.rounds):
                spent = {"eager": 0.0, "static": 0.0}
                for bi, batch in enumerate(batches):
                    for name in ("eager", "static") if (r + bi) % 2 == 0 else ("static", "eager"):
                        t0 = time.perf_counter()
                        hyps = gens[name].generate(batch)
                        spent[name] += time.perf_counter() - t0
                        if r == 0:
                            outs.setdefault(name, []).extend(h[0]["tokens"].tolist() for h in hyps)
                for name in spent:
                    times[name].append(spent[name])
        sents = bsz * args.batches
        eager, static = (sents / statistics.median(times[k]) for k in ("eager", "static"))
        same = sum(a == b for a, b in zip(outs["eager"], outs["static"]))
        rows.append((bsz, eager, static, static / eager, f"{same}/{sents}"))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} threads; "
        f"torch {torch.__version__}; commit {git_commit()}; load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"model {args.shape}, vocab {args.vocab}, sources {args.src_len // 2}-{args.src_len} tokens, beam {args.beam}, "
        f"max_len_b {args.max_len_b}, fp32, {args.batches} batches x {args.rounds} rounds (medians)"
    )
    print("| batch | eager sent/s | static sent/s | static / eager | identical best |")
    print("|---|---|---|---|---|")
    for bsz, eager, static, ratio, same in rows:
        print(f"| {bsz} | {eager:.2f} | {static:.2f} | {ratio:.3f} | {same} |")


if __name__ == "__main__":
    main()
