"""Packed against padded training steps, side by side in one run.

The packed path (the collater's layout: seqtrain.models.bart, seqtrain.models.varlen) runs every layer on the
real tokens only and attends segment by segment (torch's varlen flash kernel on CUDA, the per-segment reference
on the CPU); the padded path (the same batch without its layout) runs B x T with masked SDPA. This script trains
the same model on the same batches both ways, at several padding levels: length-bucketed batches (fairseq's:
examples sorted by length, little padding), batches sorted only within windows, and unsorted batches (much
padding). It reports non-pad tokens per second of forward + backward (the real criterion) and the padding
fraction of each batch set. The issue's target: packed never slower than padded, bucketed batches included.

    python scripts/bench/bench_packing.py                      # bart_base-wide layers, 2 + 2 of them, CPU
    python scripts/bench/bench_packing.py --layers 6 --batches 30 --threads 2

Runs alternate batch by batch (padded, then packed on the same batch, then the next batch), --repeats rounds;
each batch's best time per mode is kept, so a busy machine slows both alike. Synthetic data:
summarization-like lengths (sources 40-400 tokens, targets 8-64).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time

import numpy as np
import torch

from seqtrain.criterions import LabelSmoothedCrossEntropyCriterion
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.models.bart import BartConfig, BARTModel


class _Dict:
    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def bos(self) -> int:
        return 0

    def pad(self) -> int:
        return 1

    def eos(self) -> int:
        return 2


def make_dataset(n: int, vocab: int, seed: int, shuffle: bool = False) -> LanguagePairDataset:
    """`n` random pairs of lognormal source lengths (40-400) and targets about an eighth as long."""
    r = np.random.RandomState(seed)
    src_len = np.clip(r.lognormal(5.0, 0.6, n), 40, 400).astype(int)
    tgt_len = np.clip((src_len / 8 * r.uniform(0.5, 1.5, n)), 8, 64).astype(int)
    src = [torch.from_numpy(np.append(r.randint(4, vocab, k - 1), 2)) for k in src_len]
    tgt = [torch.from_numpy(np.append(r.randint(4, vocab, k - 1), 2)) for k in tgt_len]
    d = _Dict(vocab)
    return LanguagePairDataset(src, src_len, d, tgt, tgt_len, d, shuffle=shuffle)


def make_batches(ds: LanguagePairDataset, order: np.ndarray, max_tokens: int) -> list[list[int]]:
    """Greedy batches in `order`, each padded size (rows x longest side) under max_tokens (fairseq's rule)."""
    batches, cur, longest = [], [], 0
    for i in order:
        n = ds.num_tokens(int(i))
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(int(i))
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


def orders(ds: LanguagePairDataset, seed: int) -> dict[str, np.ndarray]:
    r = np.random.RandomState(seed)
    by_len = ds.ordered_indices(seed)  # fairseq's: by source, then target length
    windowed = np.concatenate([np.sort(w) for w in np.array_split(r.permutation(len(ds)), len(ds) // 64)])
    windowed = np.concatenate(
        [w[np.argsort(ds.src_sizes[w], kind="stable")] for w in np.array_split(windowed, len(ds) // 64)]
    )
    return {
        "length-bucketed": by_len,
        "sorted in windows of 64": windowed,
        "unsorted": r.permutation(len(ds)),
    }


def pad_fraction(samples: list[dict]) -> tuple[float, float]:
    src = torch.cat([s["net_input"]["src_tokens"].reshape(-1) for s in samples])
    tgt = torch.cat([s["net_input"]["prev_output_tokens"].reshape(-1) for s in samples])
    return float(src.eq(1).float().mean()), float(tgt.eq(1).float().mean())


def without_layout(sample: dict) -> dict:
    """The batch without the collater's layout: the model runs it padded."""
    net = {k: v for k, v in sample["net_input"].items() if k != "layout"}
    return {**sample, "net_input": net}


def time_step(model, criterion, sample: dict) -> float:
    start = time.perf_counter()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def small_bart(a: argparse.Namespace) -> tuple[BARTModel, LabelSmoothedCrossEntropyCriterion]:
    """A BART of the flags' width and depth (--vocab --layers --dim --ffn --heads), dropout off, in training
    mode, and label-smoothed cross-entropy; also used by bench_merge_update.py."""
    cfg = BartConfig(
        vocab_size=a.vocab,
        encoder_layers=a.layers,
        decoder_layers=a.layers,
        encoder_embed_dim=a.dim,
        decoder_embed_dim=a.dim,
        encoder_ffn_embed_dim=a.ffn,
        decoder_ffn_embed_dim=a.ffn,
        encoder_attention_heads=a.heads,
        decoder_attention_heads=a.heads,
        dropout=0.0,
    )
    return BARTModel(cfg).train(), LabelSmoothedCrossEntropyCriterion(1, label_smoothing=0.1)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--batches", type=int, default=12, help="batches per batch set (from the middle of it)")
    p.add_argument("--repeats", type=int, default=3)

    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--sets", default="length-bucketed,sorted in windows of 64,unsorted", help="batch sets to run"
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model, criterion = small_bart(a)
    ds = make_dataset(4000, a.vocab, a.seed)
    commit = git_commit()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} | {platform.processor() or platform.machine()}, {a.threads} threads"
        f" | torch {torch.__version__} | commit {commit} | d={a.dim} ffn={a.ffn} heads={a.heads}"
        f" layers={a.layers}+{a.layers} V={a.vocab} max-tokens={a.max_tokens}"
    )
    print("| batches | pads src / tgt | padded tok/s | packed tok/s | packed / padded |")
    print("|---|---|---|---|---|")
    for name, order in orders(ds, a.seed).items():
        if name not in a.sets.split(","):
            continue
        batches = make_batches(ds, order, a.max_tokens)
        mid = len(batches) // 2
        chosen = batches[mid : mid + a.batches]
        packed = [ds.collater([ds[i] for i in b]) for b in chosen]
        sets = {"padded": [without_layout(x) for x in packed], "packed": packed}
        tokens = sum(s["ntokens"] + int(s["net_input"]["src_lengths"].sum()) for s in sets["padded"])
        best = {mode: [float("inf")] * len(chosen) for mode in sets}
        time_step(model, criterion, sets["padded"][0])  # warm-up
        for _ in range(a.repeats):
            for i in range(len(chosen)):
                for mode, samples in sets.items():
                    best[mode][i] = min(best[mode][i], time_step(model, criterion, samples[i]))
        src_pad, tgt_pad = pad_fraction(sets["padded"])
        speed = {mode: tokens / sum(t) for mode, t in best.items()}
        print(
            f"| {name} | {src_pad:.1%} / {tgt_pad:.1%} | {speed['padded']:,.0f} | {speed['packed']:,.0f} | "
            f"{speed['packed'] / speed['padded']:.2f}x |"
        )


if __name__ == "__main__":
    main()
