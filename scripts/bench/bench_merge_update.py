"""An update's --update-freq batches as one pass (--merge-max-tokens) against accumulating them, side by side.

Batches are made as training makes them: summarization-like synthetic pairs (sources 40-400 tokens, targets
8-64, as scripts/bench/bench_packing.py), fairseq's length-bucketed batches under --max-tokens, shuffled, and
grouped --update-freq at a time. Each update runs forward + backward of the real criterion (the optimizer
step is the same either way and left out) both ways: the batches one pass each (accumulation), and the passes
LanguagePairDataset.merge_update makes of them under the budget (the merge itself, on the CPU, is inside the
timing, and reported alone). It reports non-pad tokens per second, passes per update, the merged batches'
padding (a merged batch pads its shorter examples up to its longest one; the packed path runs position-wise
work on the real tokens, attention on the padded layout), the merge's own time, and how far the two ways'
gradients are apart.

    python scripts/bench/bench_merge_update.py                   # bart_base-wide, 2 + 2 layers, CPU
    python scripts/bench/bench_merge_update.py --configs 512x4,2048x4 --updates 6 --threads 2

Updates alternate (accumulated, merged, then the next update), --repeats rounds; each update's best time per
way is kept, so a busy machine slows both alike. --budget 0 merges every update whole (no limit).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch
from bench_packing import (  # (scripts/bench/bench_packing.py, beside this one)
    git_commit,
    make_batches,
    make_dataset,
    small_bart,
)

from seqtrain.data.pair_dataset import LanguagePairDataset, padded_shape


def bucketed_batches(ds: LanguagePairDataset, max_tokens: int, seed: int) -> list[list[int]]:
    """fairseq's batches: examples by length, greedy under max_tokens (rows x longest side), then shuffled."""
    batches = make_batches(ds, ds.ordered_indices(seed), max_tokens)
    order = np.random.RandomState(seed).permutation(len(batches))
    return [batches[i] for i in order]


def run_update(model, criterion, samples: list[dict]) -> float:
    for sample in samples:
        loss, _, _ = criterion(model, sample)
        loss.backward()
    return 0.0


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument(
        "--configs",
        default="512x4,1024x4,2048x2",
        help="MAX_TOKENSxUPDATE_FREQ pairs, comma-separated",
    )
    p.add_argument(
        "--budget",
        type=int,
        default=-1,
        help="--merge-max-tokens for every config (0: merge whole updates); default: update-freq x max-tokens",
    )
    p.add_argument("--updates", type=int, default=6, help="updates per config")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model, criterion = small_bart(a)
    ds = make_dataset(4000, a.vocab, a.seed, shuffle=True)
    commit = git_commit()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} | {platform.processor() or platform.machine()}, {a.threads} threads"
        f" | torch {torch.__version__} | commit {commit} | d={a.dim} ffn={a.ffn} heads={a.heads}"
        f" layers={a.layers}+{a.layers} V={a.vocab} | {a.updates} updates x {a.repeats} rounds"
    )
    print(
        "| max-tokens x update-freq | --merge-max-tokens | passes / update | padded slots merged / separate "
        "| accumulated tok/s | merged tok/s | merged / accumulated | merge ms / update | max grad diff / max grad |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in a.configs.split(","):
        max_tokens, freq = (int(x) for x in spec.split("x"))
        budget = freq * max_tokens if a.budget < 0 else a.budget
        limit = budget if budget > 0 else 1 << 62
        batches = bucketed_batches(ds, max_tokens, a.seed)
        updates = [batches[i * freq : (i + 1) * freq] for i in range(a.updates)]
        collated = [[ds.collater([ds[i] for i in b]) for b in u] for u in updates]
        tokens = sum(s["ntokens"] + int(s["net_input"]["src_lengths"].sum()) for u in collated for s in u)
        separate = sum(r * w for u in collated for r, w in map(padded_shape, u))
        merged_sets = [ds.merge_update(u, limit) for u in collated]
        merged_slots = sum(r * w for u in merged_sets for r, w in map(padded_shape, u))
        passes = sum(len(u) for u in merged_sets) / len(merged_sets)
        # the two ways' gradients on the first update (fp32: summation order only)
        run_update(model, criterion, collated[0])
        g_acc = grads(model)
        run_update(model, criterion, merged_sets[0])
        g_mer = grads(model)
        # (relative to the largest gradient element: the keys' biases have a true gradient of zero, which
        # the two summation orders round differently)
        largest = max(float(y.abs().max()) for y in g_acc)
        diff = max(float((x - y).abs().max()) for x, y in zip(g_mer, g_acc, strict=True)) / largest
        best = {"accumulated": [float("inf")] * len(updates), "merged": [float("inf")] * len(updates)}
        merge_s = [float("inf")] * len(updates)  # the merge alone (host time on the training loop's thread)
        for _ in range(a.repeats):
            for i, u in enumerate(collated):
                start = time.perf_counter()
                run_update(model, criterion, u)
                best["accumulated"][i] = min(best["accumulated"][i], time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                passes_u = ds.merge_update(u, limit)  # the merge is part of the cost
                merge_s[i] = min(merge_s[i], time.perf_counter() - start)
                run_update(model, criterion, passes_u)
                best["merged"][i] = min(best["merged"][i], time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
        speed = {way: tokens / sum(t) for way, t in best.items()}
        print(
            f"| {max_tokens} x {freq} | {budget if budget > 0 else 'no limit'} | {passes:.2f} | "
            f"{merged_slots / separate:.2f}x | {speed['accumulated']:,.0f} | {speed['merged']:,.0f} | "
            f"{speed['merged'] / speed['accumulated']:.2f}x | {1000 * sum(merge_s) / len(merge_s):.2f} | "
            f"{diff:.1e} |"
        )


if __name__ == "__main__":
    main()
