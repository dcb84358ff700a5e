#!/usr/bin/env python
"""Benchmark generation's encoder pass packed (--packed-encoder) against padded (--no-packed-encoder).

The same weights and sources as scripts/bench/bench_generate.py (debdesc-sample valid, sentencepiece pieces cut to
--max-source; `base`: bart_base shapes with its peaked random weights, `small`: its trained bart_small, cached in
--workdir), left-padded batches of --batch-size sources in two orders:

- sorted: the sources ordered by length before batching, as seqtrain-generate and fairseq-generate batch (few pads);
- unsorted: consecutive sources as they come (the check's batches: about a quarter pads and more).

Per order, two measurements, packed and padded alternating batch by batch (which goes first alternates too):
the encoder pass alone (`encode`, every batch, --rounds rounds) and whole beam searches (SequenceGenerator with
bench_generate's settings, the first --gen-batches batches). Reported: sentences/s (wall clock, medians over
rounds), sentences per CPU-second (time.process_time: the steadier figure on a shared machine), the pad share,
and whether both passes gave the same hypotheses (they must: the encoder output is the same).

    python scripts/bench/bench_packed_encoder.py              # base, batch 16, ~10 min on one thread
    python scripts/bench/bench_packed_encoder.py --quick      # 4 batches, 1 generated batch, ~2 min
    python scripts/bench/bench_packed_encoder.py --sweep      # the encoder pass by pad share (the CPU default's
                                                              # threshold), bart_small and bart_base shapes, ~5 min
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_generate as bg  # noqa: E402  (scripts/bench/bench_generate.py: data, weights, settings)

from seqtrain.generation.sequence_generator import encode  # noqa: E402
from seqtrain.models.bart import BARTModel  # noqa: E402

SIDES = ("packed", "padded")


def batches_of(sources: list[list[int]], bsz: int, n: int, order: str) -> list[list[list[int]]]:
    """n batches of bsz sources: unsorted, the first n * bsz as they come; sorted, n batches spread evenly over
    all the sources ordered by length and cut into batches of bsz (as seqtrain-generate batches them)."""
    if order == "unsorted":
        chosen = sources[: n * bsz]
        if len(chosen) < n * bsz:
            raise SystemExit(f"not enough sources for {n} batches of {bsz}")
        return [chosen[i * bsz : (i + 1) * bsz] for i in range(n)]
    ordered = sorted(sources, key=len)
    every = [ordered[i : i + bsz] for i in range(0, len(ordered) - bsz + 1, bsz)]
    if len(every) < n:
        raise SystemExit(f"not enough sources for {n} batches of {bsz}")
    return [every[round(i * (len(every) - 1) / max(n - 1, 1))] for i in range(n)]


def timed(fn: Any) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def measure(
    model: BARTModel, batches: list[torch.Tensor], rounds: int, run: Any
) -> tuple[dict[str, dict[str, float]], list[Any]]:
    """{side: {sentences_per_s, sentences_per_cpu_s}} of `run(model, batch, packed)` over the batches, sides
    alternating; also each side's outputs of the last round (for the comparison)."""
    n = sum(b.size(0) for b in batches)
    wall: dict[str, list[float]] = {s: [] for s in SIDES}
    cpu: dict[str, list[float]] = {s: [] for s in SIDES}
    outs: dict[str, list[Any]] = {}
    for r in range(rounds):
        w = dict.fromkeys(SIDES, 0.0)
        c = dict.fromkeys(SIDES, 0.0)
        outs = {s: [] for s in SIDES}
        for bi, batch in enumerate(batches):
            for side in SIDES if (r + bi) % 2 == 0 else SIDES[::-1]:
                out, dw, dc = timed(functools.partial(run, model, batch, side == "packed"))
                w[side] += dw
                c[side] += dc
                outs[side].append(out)
        for s in SIDES:
            wall[s].append(w[s])
            cpu[s].append(c[s])
    result = {
        s: {
            "sentences_per_s": round(n / statistics.median(wall[s]), 2),
            "sentences_per_cpu_s": round(n / statistics.median(cpu[s]), 2),
        }
        for s in SIDES
    }
    return result, [outs[s] for s in SIDES]


def run_encoder(model: BARTModel, batch: torch.Tensor, packed: bool) -> torch.Tensor:
    out = encode(model, batch, None, packed)
    return out["encoder_out"][batch.ne(bg.PAD)]


def run_generate(s: Any, d: Any) -> Any:
    def run(model: BARTModel, batch: torch.Tensor, packed: bool) -> list[tuple[list[int], float]]:
        gen = bg.make_generator(model, d, s, packed_encoder=packed)
        return [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in gen.generate(batch)]

    return run


def sweep(shapes: list[str], bsz: int, width: int, shares: list[float], rounds: int) -> None:
    """The encoder pass alone at set pad shares (the CPU default's threshold): random weights of each shape
    (timing does not depend on them), bsz random sources whose lengths fall linearly from `width`."""
    print("\n| shape | pads | packed ms | padded ms | packed speedup (CPU time) |\n|---|---|---|---|---|")
    for shape in shapes:
        torch.manual_seed(0)
        model = BARTModel(bg.seqtrain_config(8000, shape)).eval()
        for share in shares:
            lengths = [width] + [
                max(1, round(width * (1 - 2 * share * i / (bsz - 1)))) for i in range(1, bsz)
            ]
            src = bg.pad_batch([torch.randint(4, 8000, (n - 1,)).tolist() + [bg.EOS] for n in lengths], True)
            times: dict[bool, list[float]] = {True: [], False: []}
            with torch.inference_mode():
                for packed in (True, False):
                    model.encoder(src, packed=packed)  # warm-up
                for r in range(rounds):
                    for packed in (True, False) if r % 2 else (False, True):
                        c0 = time.process_time()
                        model.encoder(src, packed=packed)
                        times[packed].append(time.process_time() - c0)
            a, b = statistics.median(times[True]), statistics.median(times[False])
            pads = float(src.eq(bg.PAD).float().mean())
            print(f"| {shape} | {pads:.0%} | {a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.2f}x |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 batches, 1 generated batch, 2 rounds")
    p.add_argument("--model", choices=["base", "small"], default="base")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=12, help="batches per order for the encoder pass")
    p.add_argument("--gen-batches", type=int, default=2, help="batches per order for whole beam searches")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (medians reported)")
    p.add_argument("--gen-rounds", type=int, default=1, help="timed rounds of the beam searches")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=2.0)
    p.add_argument("--no-repeat-ngram-size", type=int, default=3)
    p.add_argument("--min-len", type=int, default=5)
    p.add_argument("--max-len-b", type=int, default=60)
    p.add_argument("--max-source", type=int, default=256, help="source tokens kept (incl. EOS)")
    p.add_argument("--pieces", type=int, default=8000)
    p.add_argument("--eos-scale", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--data", default=os.path.join(bg.REPO, "data", "debdesc-sample"))
    p.add_argument("--workdir", default="/tmp/seqtrain-bench-generate")
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="only the encoder pass at set pad shares, bart_small and bart_base shapes (random weights)",
    )
    p.add_argument("--sweep-shares", default="0,0.05,0.1,0.15,0.2,0.25,0.3")
    p.add_argument("--sweep-len", type=int, default=64, help="the longest source of a sweep batch")
    args = p.parse_args()
    if args.sweep:
        if args.threads:
            torch.set_num_threads(args.threads)
        shares = [float(x) for x in args.sweep_shares.split(",")]
        sweep(["small", "base"], args.batch_size, args.sweep_len, shares, max(args.rounds, 7))
        return
    if args.quick:
        args.batches, args.gen_batches, args.rounds = 4, 1, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.workdir, exist_ok=True)
    tok, d = bg.build_vocab(args.data, args.workdir, args.pieces)
    valid = bg.encode_file(tok, d, f"{args.data}/valid.source", args.max_source)
    if args.model == "base":
        state = bg.peaked_random_state(len(d), seed=0, eos_scale=args.eos_scale)
    else:
        cache = os.path.join(args.workdir, f"small_{len(d)}_{bg.TRAIN_TOKENS}tok_150s.pt")
        if not os.path.exists(cache):
            raise SystemExit(f"{cache}: run scripts/bench/bench_generate.py --models small once to train it")
        state = torch.load(cache, weights_only=True)["state"]
    model = BARTModel(bg.seqtrain_config(len(d), args.model))
    model.load_state_dict(state)
    model.eval()
    settings = bg.Settings(
        beam=args.beam,
        lenpen=args.lenpen,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        min_len=args.min_len,
        max_len_b=args.max_len_b,
    )
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus, "
        f"load {os.getloadavg()[0]:.2f}; model {args.model}, batch {args.batch_size}",
        flush=True,
    )
    rows = []
    for order in ("sorted", "unsorted"):
        lists = batches_of(valid, args.batch_size, args.batches, order)
        batches = [bg.pad_batch(b, left=True) for b in lists]
        pads = sum(int(b.eq(bg.PAD).sum()) for b in batches) / sum(b.numel() for b in batches)
        default_packs = sum(model.encoder.packs_by_default(b.eq(bg.PAD)) for b in batches)
        with torch.inference_mode():
            run_encoder(model, batches[0][:2], True)  # warm-up
            run_encoder(model, batches[0][:2], False)
        enc, (packed_out, padded_out) = measure(model, batches, args.rounds, run_encoder)
        diff = max(float((a - b).abs().max()) for a, b in zip(packed_out, padded_out))
        gen_batches = batches[:: max(1, len(batches) // args.gen_batches)][: args.gen_batches]
        gen, (packed_hyps, padded_hyps) = measure(
            model, gen_batches, args.gen_rounds, run_generate(settings, d)
        )
        same = sum(a[0] == b[0] for pa, pb in zip(packed_hyps, padded_hyps) for a, b in zip(pa, pb))
        score_diff = max(abs(a[1] - b[1]) for pa, pb in zip(packed_hyps, padded_hyps) for a, b in zip(pa, pb))
        row = {
            "order": order,
            "pad_share": round(pads, 3),
            "default_packs": f"{default_packs}/{len(batches)}",
            "encoder": enc,
            "encoder_max_abs_diff": diff,
            "generate": gen,
            "identical_hypotheses": f"{same}/{sum(len(p) for p in packed_hyps)}",
            "score_max_abs_diff": score_diff,
            "load_avg_1min": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(
        "\n| batches | pads | encoder pass, sentences/s packed / padded (per CPU-s) | beam search, sentences/s "
        "packed / padded (per CPU-s) | same hypotheses | the CPU default packs |\n|---|---|---|---|---|---|"
    )
    for r in rows:
        e, g = r["encoder"], r["generate"]
        print(
            f"| {r['order']} | {r['pad_share']:.0%} | {e['packed']['sentences_per_s']} / "
            f"{e['padded']['sentences_per_s']} ({e['packed']['sentences_per_cpu_s']} / "
            f"{e['padded']['sentences_per_cpu_s']}) | {g['packed']['sentences_per_s']} / "
            f"{g['padded']['sentences_per_s']} ({g['packed']['sentences_per_cpu_s']} / "
            f"{g['padded']['sentences_per_cpu_s']}) | {r['identical_hypotheses']} | {r['default_packs']} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
