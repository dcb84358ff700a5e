#!/usr/bin/env python
"""Training throughput: seqtrain vs transformers' BartForConditionalGeneration, side by side in one process.

Both toolkits get the same bart-style model (same weights: seqtrain's init copied into transformers), the same
optimizer (Adam(W) with weight decay 0, same lr and betas, fp32) and the same loss (token cross-entropy; label
smoothing 0 by default so the loss values must agree; --label-smoothing 0.1 compares fairseq's formula with
torch's CrossEntropyLoss(label_smoothing), which differ slightly). Steps alternate between the toolkits (the
order flips every round) so background load hits both alike; figures are medians over the timed rounds.

Part 1, fixed batches: identical batches of 8 real examples (source cut to 256 tokens, target to 64), padded the
way each toolkit pads. seqtrain runs its real training step (Trainer.train_step with the task's criterion);
transformers runs model(**batch).loss, backward, optimizer step. Dropout is 0 here so the two runs follow the
same trajectory and the losses can be compared step by step.
Part 2, real data: each toolkit batches the train split its own way at an equal token budget per update:
transformers takes 8 random examples per batch (its Trainer's default: random sampler, padding to the longest
example of the batch); seqtrain takes length-bucketed batches in shuffled order, as `seqtrain-train` does, with
the --max-tokens that gives its batches as many token slots (source + target, padding included) on average as
transformers' batches have. Dropout 0.1 (bart's). The figure is non-padding (source + target) tokens per second.

Also printed: peak memory per step (resident memory above the level before the step, measured by benchlib.PeakRSS:
gradients, activations and temporaries; both toolkits hold the same parameters and optimizer state), useful
FLOP/s (the matmul work of the non-padding tokens, forward + backward = 3 x forward) against this machine's
measured fp32 matmul peak, and the load average.

    .venv/bin/python scripts/bench/bench_train.py --quick          # bart_small-sized, a minute or two
    .venv/bin/python scripts/bench/bench_train.py                  # bart_base, 8k vocabulary, several minutes

The data-bin (sentencepiece 8k, joined dictionary) is built from --raw into --workdir on first use.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchlib import PeakRSS, follow_tensors_with_rss  # noqa: E402  (scripts/bench/benchlib.py)

from seqtrain.checkpoint.hf import args_to_hf_config, seqtrain_state_to_hf  # noqa: E402
from seqtrain.data.batching import batch_by_size  # noqa: E402
from seqtrain.flags import parsing, training  # noqa: E402
from seqtrain.tasks import setup_task  # noqa: E402
from seqtrain.train import loop as train_loop  # noqa: E402
from seqtrain.train.program import train_config  # noqa: E402
from seqtrain.train.trainer import Trainer  # noqa: E402

PAD, EOS = 1, 2
MAX_SRC, MAX_TGT, BSZ = 256, 64, 8


# ------------------------------------------------------------------------------------------------ measuring
_ACTIVE: list[PeakRSS] = []  # the PeakRSS of the running step, for the optimizer-step hooks


def mark_before(step: Any) -> Any:
    """Wrap an optimizer's step so that the running PeakRSS notes the forward + backward peak first."""

    def wrapped(*a: Any, **kw: Any) -> Any:
        if _ACTIVE:
            _ACTIVE[-1].mark()
        return step(*a, **kw)

    return wrapped


def matmul_peak(n: int = 1536, repeats: int = 5) -> float:
    """fp32 FLOP/s of a square matmul with the current thread count: the best of `repeats`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def useful_flops(pairs: list[tuple[int, int]], d: int, ffn: int, layers: int, vocab: int) -> float:
    """Training FLOPs (3 x forward) of the matmuls the non-padding tokens need; (src_len, tgt_len) per example."""
    macs = 0
    for s, t in pairs:
        enc = s * (4 * d * d + 2 * d * ffn) + 2 * s * s * d
        dec = t * (4 * d * d + 2 * d * ffn) + t * t * d  # causal self-attention: half of t*t*d*2
        cross = t * 2 * d * d + s * 2 * d * d + 2 * t * s * d
        macs += layers * (enc + dec + cross) + t * d * vocab
    return 3 * 2 * macs


# ------------------------------------------------------------------------------------------------ data
def ensure_databin(raw: str, workdir: str) -> str:
    dest = os.path.join(workdir, "databin-" + os.path.basename(os.path.normpath(raw)))
    if os.path.exists(os.path.join(dest, "preprocess.json")):
        return dest
    print(f"building {dest} from {raw} (sentencepiece 8k, once)", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "seqtrain_cli.preprocess",
        "--source-lang",
        "source",
        "--target-lang",
        "target",
        "--trainpref",
        os.path.join(raw, "train"),
        "--destdir",
        dest,
        "--joined-dictionary",
        "--spm-vocab-size",
        "8000",
        "--no-progress-bar",
    ]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return dest


def examples(task: Any, split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(source, target) token tensors, source cut to MAX_SRC and target to MAX_TGT (each keeps its final </s>)."""
    ds = task.load_dataset(split)
    out = []
    for i in range(len(ds)):
        item = ds[i]
        src, tgt = item["source"], item["target"]
        if len(src) > MAX_SRC:
            src = torch.cat([src[: MAX_SRC - 1], src.new_tensor([EOS])])
        if len(tgt) > MAX_TGT:
            tgt = torch.cat([tgt[: MAX_TGT - 1], tgt.new_tensor([EOS])])
        out.append((src, tgt))
    return out


def seqtrain_batch(task: Any, exs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    ds = task.datasets["train"]
    return ds.collater([{"id": i, "source": s, "target": t} for i, (s, t) in enumerate(exs)])


def hf_batch(exs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """transformers' layout of the same examples: right-padded input_ids, labels with -100 at pads, decoder input
    = labels shifted right behind </s> (BART's decoder_start_token_id)."""
    b, s, t = len(exs), max(len(x[0]) for x in exs), max(len(x[1]) for x in exs)
    input_ids = torch.full((b, s), PAD, dtype=torch.long)
    labels = torch.full((b, t), -100, dtype=torch.long)
    for i, (src, tgt) in enumerate(exs):
        input_ids[i, : len(src)] = src
        labels[i, : len(tgt)] = tgt
    decoder_input_ids = torch.full((b, t), PAD, dtype=torch.long)
    decoder_input_ids[:, 0] = EOS
    shifted = labels[:, :-1]
    decoder_input_ids[:, 1:] = torch.where(shifted == -100, PAD, shifted)
    return {
        "input_ids": input_ids,
        "attention_mask": input_ids.ne(PAD).long(),
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }


def nonpad_tokens(exs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(len(s) + len(t) for s, t in exs)


def padded_tokens(exs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return len(exs) * (max(len(s) for s, _ in exs) + max(len(t) for _, t in exs))


def match_budget(exs: list[tuple[torch.Tensor, torch.Tensor]], budget: float) -> tuple[int, list[Any]]:
    """The --max-tokens whose length-bucketed batches (fairseq's rule: batch size x longest max(src, tgt)) hold
    `budget` token slots (source + target, padding included) on average; returns it and its batches."""
    sizes = np.array([max(len(s), len(t)) for s, t in exs], dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    lo, hi = MAX_SRC, 64 * MAX_SRC
    best: tuple[int, list[Any]] = (lo, [])
    while lo <= hi:
        mid = (lo + hi) // 2
        batches = batch_by_size(
            order, num_tokens_vec=sizes[order], max_tokens=mid, required_batch_size_multiple=8
        )
        mean = statistics.mean(padded_tokens([exs[i] for i in b]) for b in batches)
        best = (mid, batches)
        if mean < budget:
            lo = mid + 1
        else:
            hi = mid - 1
    return best


# ------------------------------------------------------------------------------------------------ toolkits
class SeqtrainRunner:
    name = "seqtrain"

    def __init__(self, trainer: Trainer, task: Any):
        self.trainer, self.task = trainer, task
        trainer.optimizer.step = mark_before(trainer.optimizer.step)

    def step(self, exs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """One update; returns the mean token loss (natural log) before the update."""
        self.trainer.optimizer.zero_grad()
        stats = self.trainer.train_step([seqtrain_batch(self.task, exs)])
        self.trainer.optimizer.zero_grad()  # free gradients, as the other runner does
        return stats["loss"] * math.log(2)


class HFRunner:
    name = "transformers"

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        label_smoothing: float,
        implementation: dict[str, Any],
    ):
        self.model = model
        # the same torch.optim.AdamW implementation (fused / foreach) as seqtrain's, so only the toolkits differ
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=0.0, **implementation
        )
        self.optimizer.step = mark_before(self.optimizer.step)
        self.label_smoothing = label_smoothing

    def step(self, exs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        self.model.train()
        batch = hf_batch(exs)
        if self.label_smoothing > 0:
            labels = batch.pop("labels")
            logits = self.model(**batch).logits
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)),
                labels.view(-1),
                ignore_index=-100,
                label_smoothing=self.label_smoothing,
            )
        else:
            loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def build(
    args: argparse.Namespace, databin: str, dropout: float
) -> tuple[SeqtrainRunner, HFRunner, Any, Any]:
    import transformers

    argv = [
        databin,
        "--arch",
        args.arch,
        "--cpu",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--lr",
        str(args.lr),
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        str(args.label_smoothing),
        "--dropout",
        str(dropout),
        "--max-tokens",
        "2048",
        "--seed",
        "1",
        "--max-source-positions",
        "1024",
        "--max-target-positions",
        "1024",
    ]
    targs = parsing.parse_args_and_arch(training.get_training_parser(), argv)
    cfg = train_config(targs)
    task = setup_task(cfg.task)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    trainer = train_loop.build_trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    config = args_to_hf_config(targs, len(task.tgt_dict))
    config.pop("architectures", None)
    config.pop("model_type", None)
    hf_cfg = transformers.BartConfig(**config, attn_implementation="sdpa")
    hf = transformers.BartForConditionalGeneration(hf_cfg)
    missing, unexpected = hf.load_state_dict(seqtrain_state_to_hf(model.state_dict()), strict=False)
    if unexpected or any(not k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in missing):
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")
    defaults = trainer.optimizer.optimizer.defaults
    implementation = {k: bool(defaults.get(k)) for k in ("fused", "foreach") if defaults.get(k)}
    hf_runner = HFRunner(hf, args.lr, (0.9, 0.98), 1e-8, args.label_smoothing, implementation)
    print(f"AdamW for both toolkits: {implementation or 'torch default'}", flush=True)
    return SeqtrainRunner(trainer, task), hf_runner, targs, task


def alternate(
    runners: list[Any], batches: dict[str, list[Any]], rounds: int, warmup: int, flops_of: Any
) -> dict[str, dict[str, Any]]:
    """Warm-up steps, then `rounds` rounds of one step per toolkit (order flipped each round)."""
    out: dict[str, dict[str, Any]] = {
        r.name: {"tok_s": [], "flop_s": [], "mem": [], "fb_mem": [], "loss": [], "time": []} for r in runners
    }
    for i in range(warmup + rounds):
        order = runners if i % 2 == 0 else runners[::-1]
        for r in order:
            exs = batches[r.name][i]
            with PeakRSS() as mem:
                _ACTIVE.append(mem)
                t = time.perf_counter()
                loss = r.step(exs)
                dt = time.perf_counter() - t
                _ACTIVE.pop()
            o = out[r.name]
            o["loss"].append(loss)
            if i >= warmup:
                o["tok_s"].append(nonpad_tokens(exs) / dt)
                o["flop_s"].append(flops_of(exs) / dt)
                o["mem"].append(mem.increase)
                o["fb_mem"].append(mem.marked_increase)
                o["time"].append(dt)
            print(
                f"  {'warm-up' if i < warmup else 'round ' + str(i - warmup + 1)} {r.name:12s} {dt:6.2f} s "
                f"loss {loss:.5f} nonpad tok/s {nonpad_tokens(exs) / dt:8.1f} "
                f"peak +{mem.increase / 2**20:7.1f} MiB (forward+backward +{mem.marked_increase / 2**20:7.1f})",
                flush=True,
            )
    return out


def summarize(title: str, res: dict[str, dict[str, Any]], peak: float) -> dict[str, Any]:
    s, h = res["seqtrain"], res["transformers"]
    med = statistics.median
    row = {
        "seqtrain_tok_s": med(s["tok_s"]),
        "transformers_tok_s": med(h["tok_s"]),
        "speedup": med(s["tok_s"]) / med(h["tok_s"]),
        "seqtrain_step_s": med(s["time"]),
        "transformers_step_s": med(h["time"]),
        "seqtrain_peak_mib": max(s["mem"]) / 2**20,
        "transformers_peak_mib": max(h["mem"]) / 2**20,
        "memory_ratio": max(s["mem"]) / max(h["mem"]),
        "seqtrain_fb_peak_mib": max(s["fb_mem"]) / 2**20,
        "transformers_fb_peak_mib": max(h["fb_mem"]) / 2**20,
        "fb_memory_ratio": max(s["fb_mem"]) / max(h["fb_mem"]),
        "seqtrain_flops": med(s["flop_s"]),
        "transformers_flops": med(h["flop_s"]),
    }
    print(f"\n{title}")
    print(
        f"  non-padding tokens/s (median): seqtrain {row['seqtrain_tok_s']:.1f}, transformers "
        f"{row['transformers_tok_s']:.1f}, ratio {row['speedup']:.2f}x"
    )
    print(
        f"  step time (median): seqtrain {row['seqtrain_step_s']:.2f} s, "
        f"transformers {row['transformers_step_s']:.2f} s"
    )
    print(
        f"  peak memory per step (above the pre-step level): seqtrain {row['seqtrain_peak_mib']:.0f} MiB, "
        f"transformers {row['transformers_peak_mib']:.0f} MiB, ratio {row['memory_ratio']:.2f}"
    )
    print(
        f"  of which forward + backward (activations, gradients): seqtrain {row['seqtrain_fb_peak_mib']:.0f} MiB, "
        f"transformers {row['transformers_fb_peak_mib']:.0f} MiB, ratio {row['fb_memory_ratio']:.2f}"
    )
    print(
        f"  useful FLOP/s: seqtrain {row['seqtrain_flops'] / 1e9:.1f} G ({100 * row['seqtrain_flops'] / peak:.0f}% "
        f"of the matmul peak), transformers {row['transformers_flops'] / 1e9:.1f} G "
        f"({100 * row['transformers_flops'] / peak:.0f}%)"
    )
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="bart_small, 2 rounds: a development run")
    p.add_argument("--arch", default=None, help="default: bart_base (bart_small with --quick)")
    p.add_argument(
        "--raw",
        default=None,
        help="raw corpus folder with train.source/train.target (default: ../shared/data/debdesc, "
        "else data/debdesc-sample)",
    )
    p.add_argument("--data", default=None, help="an existing data-bin (skips building one from --raw)")
    p.add_argument("--workdir", default="/tmp/seqtrain-bench-train")
    p.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per part (default 4; 2 with --quick)"
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--part", choices=["fixed", "real", "both"], default="both")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    args.arch = args.arch or ("bart_small" if args.quick else "bart_base")
    rounds = args.rounds or (2 if args.quick else 4)
    follow_tensors_with_rss()
    if args.threads:
        torch.set_num_threads(args.threads)
    raw = args.raw
    if raw is None:
        shared = os.path.join(os.path.dirname(REPO), "shared", "data", "debdesc")
        raw = (
            shared
            if os.path.exists(os.path.join(shared, "train.source"))
            else os.path.join(REPO, "data", "debdesc-sample")
        )
    os.makedirs(args.workdir, exist_ok=True)
    databin = args.data or ensure_databin(raw, args.workdir)

    load = os.getloadavg()
    peak = matmul_peak()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s",
        flush=True,
    )
    results: dict[str, Any] = {
        "arch": args.arch,
        "threads": torch.get_num_threads(),
        "matmul_peak": peak,
        "load_before": load,
        "label_smoothing": args.label_smoothing,
    }
    rng = random.Random(0)

    if args.part in ("fixed", "both"):
        seq, hf, targs, task = build(args, databin, dropout=0.0)
        exs = examples(task)
        d, ffn, layers, vocab = (
            targs.encoder_embed_dim,
            targs.encoder_ffn_embed_dim,
            targs.encoder_layers,
            len(task.tgt_dict),
        )
        flops_of = lambda b: useful_flops([(len(s), len(t)) for s, t in b], d, ffn, layers, vocab)  # noqa: E731
        n_params = sum(p.numel() for p in seq.trainer.model.parameters())
        print(
            f"\npart 1: identical fixed batches of {BSZ} real examples ({args.arch}, {n_params / 1e6:.1f} M "
            f"parameters, vocabulary {vocab}, dropout 0)",
            flush=True,
        )
        fixed = [rng.sample(exs, BSZ) for _ in range(1 + rounds)]
        pad_share = 1 - sum(nonpad_tokens(b) for b in fixed) / sum(padded_tokens(b) for b in fixed)
        res = alternate([seq, hf], {"seqtrain": fixed, "transformers": fixed}, rounds, 1, flops_of)
        diffs = [abs(a - b) / b for a, b in zip(res["seqtrain"]["loss"], res["transformers"]["loss"])]
        row = summarize(f"part 1 ({pad_share:.0%} of the batch slots are padding)", res, peak)
        row["max_rel_loss_diff"] = max(diffs)
        row["losses"] = {k: v["loss"] for k, v in res.items()}
        print(
            f"  loss per step, seqtrain vs transformers: max relative difference {max(diffs):.1e}"
            + (" (label smoothing: the formulas differ)" if args.label_smoothing else "")
        )
        results["fixed"] = row
        del seq, hf

    if args.part in ("real", "both"):
        seq, hf, targs, task = build(args, databin, dropout=0.1)
        exs = examples(task)
        d, ffn, layers, vocab = (
            targs.encoder_embed_dim,
            targs.encoder_ffn_embed_dim,
            targs.encoder_layers,
            len(task.tgt_dict),
        )
        flops_of = lambda b: useful_flops([(len(s), len(t)) for s, t in b], d, ffn, layers, vocab)  # noqa: E731
        # transformers: 8 random examples per batch. seqtrain: its length-bucketed batches (fairseq's num_tokens =
        # max(src, tgt) per example) within 8 x 256 token slots, drawn in random order.
        # The token budget: transformers' mean padded batch (8 x (longest source + longest target)) over one
        # shuffled epoch; seqtrain's --max-tokens is set so that its batches hold as many token slots on average.
        shuffled = rng.sample(exs, len(exs))
        hf_epoch = [shuffled[i : i + BSZ] for i in range(0, len(shuffled) - BSZ + 1, BSZ)]
        budget = statistics.mean(map(padded_tokens, hf_epoch))
        max_tokens, buckets = match_budget(exs, budget)
        hf_batches = rng.sample(hf_epoch, 1 + rounds)
        picks = rng.sample(range(len(buckets)), 1 + rounds)
        seq_batches = [[exs[i] for i in buckets[k]] for k in picks]
        results["budget"] = {"mean_token_slots": budget, "seqtrain_max_tokens": max_tokens}
        print(
            f"\npart 2: real data, each toolkit batching its own way (dropout 0.1) at {budget:.0f} token slots per "
            f"update on average (seqtrain: --max-tokens {max_tokens}); seqtrain batches hold "
            f"{statistics.median(len(b) for b in seq_batches):.0f} sentences (median), padding "
            f"{1 - sum(map(nonpad_tokens, seq_batches)) / sum(map(padded_tokens, seq_batches)):.0%}; "
            f"transformers 8 sentences, padding "
            f"{1 - sum(map(nonpad_tokens, hf_batches)) / sum(map(padded_tokens, hf_batches)):.0%}",
            flush=True,
        )
        res = alternate([seq, hf], {"seqtrain": seq_batches, "transformers": hf_batches}, rounds, 1, flops_of)
        row = summarize("part 2 (real data)", res, peak)
        # Peak memory over an epoch comes from each toolkit's largest batch: the length bucket with the most
        # token slots, and the 8 random examples (of one shuffled epoch) with the longest source.
        worst = {
            "transformers": max(hf_epoch, key=padded_tokens),
            "seqtrain": max(([exs[i] for i in b] for b in buckets), key=padded_tokens),
        }
        for r in (seq, hf):
            with PeakRSS() as mem:
                _ACTIVE.append(mem)
                r.step(worst[r.name])
                _ACTIVE.pop()
            row[f"{r.name}_epoch_peak_mib"] = mem.increase / 2**20
            row[f"{r.name}_epoch_fb_peak_mib"] = mem.marked_increase / 2**20
            row[f"{r.name}_largest_batch"] = (len(worst[r.name]), padded_tokens(worst[r.name]))
        row["epoch_memory_ratio"] = row["seqtrain_epoch_peak_mib"] / row["transformers_epoch_peak_mib"]
        row["epoch_fb_memory_ratio"] = (
            row["seqtrain_epoch_fb_peak_mib"] / row["transformers_epoch_fb_peak_mib"]
        )
        print(
            f"  peak memory on each toolkit's largest batch of an epoch: seqtrain "
            f"{row['seqtrain_epoch_peak_mib']:.0f} MiB ({row['seqtrain_largest_batch'][0]} sentences, "
            f"{row['seqtrain_largest_batch'][1]} token slots), transformers {row['transformers_epoch_peak_mib']:.0f} "
            f"MiB ({row['transformers_largest_batch'][1]} token slots), ratio {row['epoch_memory_ratio']:.2f}; "
            f"forward + backward: {row['seqtrain_epoch_fb_peak_mib']:.0f} vs "
            f"{row['transformers_epoch_fb_peak_mib']:.0f} MiB, ratio {row['epoch_fb_memory_ratio']:.2f}"
        )
        results["real"] = row
        del seq, hf

    results["load_after"] = os.getloadavg()
    print(f"\nload average after: {results['load_after'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
