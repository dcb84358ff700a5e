#!/usr/bin/env python
"""The prepared GPU run that decides the speed work (issues 26, 27, 39 and 49), run by scripts/gpu/gpu_speed.sh:
commands of at most 10 minutes on one GPU, with only what the GPU image has. Writes $OUT/gpu_speed.json and
$OUT/gpu_speed.md (a table, targets beside the figures) after every stage, so a stop keeps what ran. Each stage
has a seconds budget: a stage whose budget no longer fits the time left is skipped ("skipped: budget"), and a
watchdog saves the results and stops the process at the run's own deadline. `--plan` prints the chosen stages'
budgets against the run's and says whether they fit, without running anything. The wanted stages' batches are
built on the CPU (pinned on CUDA) by a background thread while `env` runs; the later stages start when they are
built, so none is timed beside it. Every stage's record says whether cuDNN attention was on when it started
(`cudnn_sdp_at_start`).

  env               device, torch, CUDA, cuDNN, transformers; the peak FLOP/s MFU is taken against;
                    varlen_attn's signature; whether transformers offers flex attention for BART and which
                    FlashAttention implementations torch registers (FA3, FA4) and their modules are installed
  ceilings          bf16 GEMM TFLOP/s at bart_large's layer shapes (d 1,024, FFN 4,096, the 50,265-word output
                    projection; 16k and 64k tokens), device copy and pinned host-to-device bandwidth
  align             the vocabulary's products against the output weight padded to a multiple of 1, 8, 64, 128
                    rows (Megatron pads to 128): the three GEMMs of the loss, the projected loss's forward and
                    backward, one beam step's logits (the static decoding step's aligned_output_weight)
  attention         fwd+bwd at 64 pairs of 900-1,024 source and 50-110 target tokens, 16 heads of 64, bf16:
                    masked SDPA on the padded layout, varlen attention by seqtrain's dispatcher, flash on equal
                    lengths, cuDNN at one fixed shape (encoder self, decoder causal self, cross): ms, TFLOP/s of
                    the real tokens, error against fp32, bitwise-deterministic backward
  attention_lever   the encoder's self-attention at several shape buckets (65,536 token slots each): cuDNN
                    (masked, and equal lengths) against varlen and flash, the first call (which builds cuDNN's
                    plan for the shape) timed apart; FA3 / FA4 through torch.nn.attention's
                    activate_flash_attention_impl when the image has them
  packed_vs_padded  bart_large, bf16: one 16k batch packed (the collater's layout) and padded (without it):
                    loss within 1e-2, ms
  merged_update     one update of configs/bart_large_cnndm.yaml's batches (4 x 16k) as one pass
                    (LanguagePairDataset.merge_update, --merge-max-tokens) against 4 passes: loss, gradients, ms
  train_ab          65,536 tokens an update, bf16, fused AdamW: (a) 4 x 16k accumulated, (b) merged into one
                    pass, (c) (b) with per-layer --compile; tokens/s, MFU, peak GiB, profiled device-busy against
                    wall ms and top kernels, compile seconds, recompiles on a second batch shape; bart_large, then
                    bart_base
  determinism       scripts/gpu/stage_determinism.py's stage_determinism(check) when the file is there
  train_fair_large  seqtrain against transformers at its best in the same one-pass layout, alternated rounds of
  train_fair_base   >= 10 updates (scripts/gpu/stage_fair.py); bart_large, bart_base
  generate_fair     beam search: seqtrain's static decoding against transformers' default, static-cache and
                    compiled static-cache generate, fp32 and bf16, alternated passes (stage_fair.py)
  serve             scripts/bench/bench_serve.py on the GPU when the file is there (seqtrain-serve, issue 52)

--dry-run runs every stage on the CPU with tiny shapes (what needs CUDA is skipped with its reason; --dry-compile
also compiles transformers' model there); tests/repo/test_gpu_speed.py checks its JSON. Targets (one H100/H200):
bart_large bf16 training >= 1.8x transformers' best one-pass setting and >= 45% MFU, bart_base >= 1.5x; beam
search bf16 >= 2x transformers' best generate, fp32 >= 2x with identical hypotheses; 0 recompiles at a second
shape.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import re
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import nullcontext
from typing import Any

STARTED = time.monotonic()  # the budget counts from here: importing torch and transformers takes seconds

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_check  # noqa: E402  (also puts the repository, scripts/gpu and scripts/bench on sys.path)
import gpu_check_lib as lib  # noqa: E402
import stage_fair  # noqa: E402

from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.data.pair_dataset import LanguagePairDataset, bucketed, padded_shape  # noqa: E402
from seqtrain.train.flops import Seq2SeqFlops  # noqa: E402

CONFIG = os.path.join(gpu_check.REPO, "configs", "bart_large_cnndm.yaml")
# (stage, figure, comparison, target): the figures the targets judge, in the summary table
JUDGED = [
    ("train_fair_large", "bart_large_speedup", ">=", 1.8),
    ("train_fair_large", "bart_large_best_mfu", ">=", 0.45),
    ("train_fair_large", "bart_large_recompiles_second_shape", "<=", 0),
    ("train_fair_large", "bart_large_step0_loss_rel_diff", "<=", 1e-2),
    ("train_fair_base", "bart_base_speedup", ">=", 1.5),
    ("train_fair_base", "bart_base_recompiles_second_shape", "<=", 0),
    ("train_fair_base", "bart_base_step0_loss_rel_diff", "<=", 1e-2),
    ("generate_fair", "bf16_speedup", ">=", 2.0),
    ("generate_fair", "fp32_speedup", ">=", 2.0),
    ("generate_fair", "fp32_identical_share", ">=", 1.0),
    ("packed_vs_padded", "loss_rel_diff", "<=", 1e-2),
    ("merged_update", "loss_rel_diff", "<=", 1e-2),
    ("merged_update", "grad_rel_err", "<=", 5e-2),
    ("train_ab", "bart_large_best_mfu", ">=", 0.45),
    ("train_ab", "bart_large_compiled_recompiles_second_shape", "<=", 0),
]


def preset_batches() -> tuple[int, int]:
    """(max-tokens, update-freq) of configs/bart_large_cnndm.yaml, read line by line (PyYAML is not assumed)."""
    with open(CONFIG, encoding="utf-8") as f:
        text = f.read()

    def value(key: str) -> int:
        m = re.search(rf"^{key}:\s*(\d+)", text, re.M)
        if m is None:
            raise RuntimeError(f"{CONFIG} has no {key}")
        return int(m.group(1))

    return value("max-tokens"), value("update-freq")


class Shapes:
    """The run's sizes: bart_large's and CNN/DM's on a GPU, tiny ones in a dry run."""

    def __init__(self, dry: bool):
        max_tokens, self.update_freq = preset_batches()
        self.vocab = 1000 if dry else lib.BART_VOCAB
        self.large, self.base = ("bart_tiny", "bart_tiny") if dry else ("bart_large", "bart_base")
        self.max_tokens = 256 if dry else max_tokens
        # --merge-max-tokens: 1.25 x the update's max-tokens x update-freq slots (81,920), so an update is one
        # pass: its batches (16-18 rows each) padded to the widest hold up to ~74k slots, more than 65,536
        # (which would leave 2 passes); packed, the pass runs on its ~62k real tokens alone
        self.merge_tokens = self.max_tokens * self.update_freq * 5 // 4
        self.src, self.tgt = ((40, 64), (8, 16)) if dry else ((900, 1024), (50, 110))
        # the second shape: other rows and tokens and another source max length (1,024 -> 704 after
        # pair_dataset's rounding to 64); the dry run's moves both sides' max lengths too (64 -> 128), so a
        # compiled layer that recompiles on a new max length recompiles in the dry run as well
        self.src2, self.tgt2 = ((70, 100), (66, 90)) if dry else ((400, 700), (30, 80))
        self.attention_pairs = 8 if dry else 64
        self.heads, self.head_dim = (4, 16) if dry else (16, 64)
        # updates of each train_ab variant: warm-up (the first one compiles), timed, profiled
        self.warmup, self.timed, self.profiled = (1, 1, 1) if dry else (2, 3, 3)
        # the fair stages (stage_fair.py): warm-up updates, alternated rounds (on a GPU >= 10 samples an
        # engine; a dry run's 4: each of its 4 engines leads one round), profiled updates; generation:
        # sentences, batch size, warm-up passes, alternated timed passes
        self.fair_warmup, self.fair_rounds, self.fair_profiled = (1, 4, 1) if dry else (2, 10, 2)
        self.gen_sentences, self.gen_batch = (4, 2) if dry else (128, 32)
        self.gen_warmup, self.gen_rounds = (1, 3) if dry else (2, 5)


class SpeedCheck(gpu_check.Check):
    """gpu_check's Check (device, peak FLOP/s, results) with the run's deadline, the current stage's figures
    and deadline, the batches being built, and what one stage leaves the next (initial weights, losses)."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.start = getattr(args, "started", None) or time.monotonic()
        self.deadline = self.start + args.budget
        self.stage_deadline = self.deadline
        self.current: str | None = None
        self.stage_start, self.stage_budget = self.start, 0.0
        self.stage_figures: dict[str, Any] = {}
        self.shapes = Shapes(self.dry)
        self.dry_compile = getattr(args, "dry_compile", False)
        self.serve_args = getattr(args, "serve_args", None)
        self.cache: dict[str, Any] = {}
        self.results["budget_s"] = args.budget
        self.batches = Batches(self, getattr(args, "stages", "").split(","))

    def left(self) -> float:
        """Seconds until the current stage's deadline (its budget from its start, within the run's)."""
        return self.stage_deadline - time.monotonic()

    def need(self, gpu_seconds: float) -> float:
        """Seconds a part of a stage needs before it starts: its GPU estimate; none in a dry run, whose parts
        all run (only whole stages skip there, as the budget test checks)."""
        return -math.inf if self.dry else gpu_seconds

    def save(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        for name, text in (
            ("gpu_speed.json", json.dumps(self.results, indent=1, default=float)),
            ("gpu_speed.md", report(self.results)),
        ):
            path = os.path.join(self.out, name)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)


# ------------------------------------------------------------------------------------------------ batches
def _pair_dataset(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> LanguagePairDataset:
    d = Dictionary()  # (the dataset reads only <pad> and </s>: 1 and 2, as lib.PAD and lib.EOS)
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    return LanguagePairDataset(src, [len(s) for s in src], d, tgt, [len(t) for t in tgt], d)


def _updates(
    check: SpeedCheck, n: int, src: tuple[int, int], tgt: tuple[int, int], seed: int
) -> tuple[LanguagePairDataset, list[list[dict[str, Any]]], list[list[list[int]]]]:
    """(dataset, `n` updates of collated batches, their example indices) as training makes them under the
    preset: examples in fairseq's length order, greedy batches of at most max-tokens padded slots, shuffled,
    update-freq batches an update; batches in pinned memory on CUDA."""
    import bench_packing
    import numpy as np

    s = check.shapes
    per_batch = max(1, s.max_tokens // src[1])  # rows of a batch of the longest sources, the fewest
    pairs = lib.make_pairs(int(1.5 * n * s.update_freq * s.max_tokens / src[0]) + 8, src, tgt, s.vocab, seed)
    ds = _pair_dataset(pairs)
    batches = bench_packing.make_batches(ds, ds.ordered_indices(seed), s.max_tokens)
    batches = [batches[i] for i in np.random.RandomState(seed).permutation(len(batches))]
    batches = [b for b in batches if len(b) >= per_batch][: n * s.update_freq]  # (no short tail batch)
    if len(batches) < n * s.update_freq:
        raise RuntimeError(f"made {len(batches)} batches, {n * s.update_freq} needed")
    idx = [batches[i : i + s.update_freq] for i in range(0, len(batches), s.update_freq)]
    collated = [[lib.pinned(ds.collater([ds[i] for i in b]), check.device) for b in u] for u in idx]
    return ds, collated, idx


def _hf_fixed(batch: dict[str, torch.Tensor], src_width: int, tgt_width: int) -> dict[str, torch.Tensor]:
    """transformers' batch padded on the right to fixed widths (as a torch.compile user pads to avoid
    recompiles)."""
    pad = {"input_ids": lib.PAD, "attention_mask": 0, "decoder_input_ids": lib.PAD, "labels": -100}
    out = {}
    for k, v in batch.items():
        width = src_width if k in ("input_ids", "attention_mask") else tgt_width
        out[k] = F.pad(v, (0, width - v.size(1)), value=pad[k])
    return out


def _build_attention(check: SpeedCheck) -> dict[str, list[int]]:
    s = check.shapes
    pairs = lib.make_pairs(s.attention_pairs, s.src, s.tgt, s.vocab, seed=31)
    return {"src": [len(a) for a, _ in pairs], "tgt": [len(b) for _, b in pairs]}


def _build_update(check: SpeedCheck) -> dict[str, Any]:
    ds, updates, _ = _updates(check, 1, check.shapes.src, check.shapes.tgt, seed=32)
    return {"ds": ds, "update": updates[0]}


def _build_train(check: SpeedCheck) -> dict[str, Any]:
    s = check.shapes
    ds, updates, idx = _updates(check, s.warmup + s.timed + s.profiled, s.src, s.tgt, seed=33)
    _, second, _ = _updates(check, 1, s.src2, s.tgt2, seed=34)
    return {"ds": ds, "updates": updates, "idx": idx, "second": second[0]}


def _build_fair(check: SpeedCheck) -> dict[str, Any]:
    """The fair stages' updates (warm-up, rounds, profiled) and second shape, and for each update transformers'
    one-pass batch: the update's pairs in one batch, padded on the right to its widest ("dynamic") and to the
    fixed widths of the longest lengths bucketed ("fixed": one shape for torch.compile and cuDNN's plans)."""
    s = check.shapes
    ds, updates, idx = _updates(check, s.fair_warmup + s.fair_rounds + s.fair_profiled, s.src, s.tgt, seed=35)
    _, second, _ = _updates(check, 1, s.src2, s.tgt2, seed=36)
    cpu, widths = torch.device("cpu"), (bucketed(s.src[1]), bucketed(s.tgt[1]))
    hf = []
    for update in idx:
        batch = lib.hf_batch([(ds.src[i], ds.tgt[i]) for b in update for i in b], cpu)
        hf.append(
            {
                "dynamic": lib.pinned(batch, check.device),
                "fixed": lib.pinned(_hf_fixed(batch, *widths), check.device),
            }
        )
    return {"ds": ds, "updates": updates, "second": second[0], "hf": hf, "hf_widths": widths}


class Batches:
    """The wanted stages' batches, built in one background thread in stage order while `env` runs; every later
    stage starts when they are built (settle), so no stage is timed while the builder holds the GIL and a
    core (transformers' generate and eager steps are host-bound: they would pay for it, seqtrain's CUDA graphs
    would not). A builder no wanted stage named runs when first asked for."""

    BUILDERS = (
        ("attention", _build_attention, ("attention",)),
        ("update", _build_update, ("packed_vs_padded", "merged_update")),
        ("train", _build_train, ("train_ab",)),
        ("fair", _build_fair, ("train_fair_large", "train_fair_base")),
    )

    def __init__(self, check: SpeedCheck, stages: list[str]):
        self._check = check
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batches")
        self._futures = {
            name: self._pool.submit(fn, check)
            for name, fn, users in self.BUILDERS
            if set(users) & set(stages)
        }

    def settle(self) -> float:
        """Wait until every builder submitted so far has finished (or failed: its stage reports it); the
        seconds waited."""
        start = time.monotonic()
        wait(list(self._futures.values()))
        return time.monotonic() - start

    def get(self, name: str) -> Any:
        if name not in self._futures:
            fn = next(f for n, f, _ in self.BUILDERS if n == name)
            self._futures[name] = self._pool.submit(fn, self._check)
        return self._futures[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------------------------------------ helpers
def _sync_ms(check: SpeedCheck, fn: Callable[[], Any], reps: int) -> float:
    """Mean ms of `reps` calls of `fn`, one sync around them all."""
    check.sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    check.sync()
    return 1000 * (time.perf_counter() - start) / reps


def _free(check: SpeedCheck) -> None:
    gc.collect()
    gpu_check.reset_memory(check)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _grad_rel_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest gradient difference relative to the largest gradient element (one sync)."""
    diff = torch.stack([(x.float() - y.float()).abs().max() for x, y in zip(a, b, strict=True)]).max()
    ref = torch.stack([y.float().abs().max() for y in b]).max()
    return float(diff / ref.clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------ stages
def stage_env(check: SpeedCheck) -> dict[str, Any]:
    import inspect

    out = check.stage_figures
    out.update(gpu_check.stage_env(check))
    try:
        from torch.nn.attention.varlen import varlen_attn

        out["varlen_attn_signature"] = str(inspect.signature(varlen_attn))[:300]
    except ImportError as e:
        out["varlen_attn_signature"] = f"absent: {e}"
    from seqtrain.models import varlen

    out["varlen_kernel_adapted"] = varlen.varlen_kernel() is not None
    s = check.shapes
    out.update(max_tokens=s.max_tokens, update_freq=s.update_freq, merge_max_tokens=s.merge_tokens)
    out.update(_software())
    return out


def _software() -> dict[str, Any]:
    """What the image holds for the fair comparisons: cuDNN's version and torch's default for cuDNN
    attention, transformers' and peft's versions, whether transformers offers flex attention for BART, the
    FlashAttention implementations torch registers and whether their modules are installed (no network on the
    GPU machine: only what is there counts)."""
    import importlib.metadata
    import importlib.util

    import transformers
    from transformers.models.bart import modeling_bart

    out: dict[str, Any] = {
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cudnn_sdp_default": gpu_check.DEFAULT_CUDNN_SDP,
        "transformers": transformers.__version__,
        "bart_supports_flex_attn": bool(
            getattr(modeling_bart.BartPreTrainedModel, "_supports_flex_attn", False)
        ),
    }
    flex = getattr(transformers.utils, "is_torch_flex_attn_available", None)
    out["transformers_flex_available"] = bool(flex()) if flex is not None else False
    for dist in ("peft", "flash-attn", "flash-attn-3"):
        try:
            out[f"{dist}_version"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[f"{dist}_version"] = None
    for module in ("flash_attn_interface", "flash_attn", "flash_attn.cute"):
        try:
            out[f"module_{module}"] = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # (a parent package missing)
            out[f"module_{module}"] = False
    try:
        from torch.nn.attention import list_flash_attention_impls

        out["flash_attention_impls"] = list_flash_attention_impls()
    except ImportError:
        out["flash_attention_impls"] = f"absent: torch {torch.__version__} has no list_flash_attention_impls"
    return out


def stage_ceilings(check: SpeedCheck) -> dict[str, Any]:
    """bf16 GEMMs (F.linear: x @ W^T, and fc1's weight gradient dY^T @ X) at bart_large's layer shapes, the
    odd vocabulary's against the weight as it is and padded to 8 rows (more multiples: stage_align); and
    bandwidth: a device-to-device copy (bytes read +
    written) and pinned host-to-device."""
    out = check.stage_figures
    dev, bf16 = check.device, torch.bfloat16
    d, f, v = (64, 256, 1000) if check.dry else (1024, 4096, lib.BART_VOCAB)
    reps = 2 if check.dry else 10
    best = 0.0
    for m in (256, 1024) if check.dry else (16384, 65536):
        tag = f"M{m // 1024}k" if m >= 1024 else f"M{m}"
        x, h, dy = (torch.randn(m, k, device=dev, dtype=bf16) for k in (d, f, f))
        cases = {
            "qkv": (x, torch.randn(3 * d, d, device=dev, dtype=bf16)),
            "attn_out": (x, torch.randn(d, d, device=dev, dtype=bf16)),
            "fc1": (x, torch.randn(f, d, device=dev, dtype=bf16)),
            "fc2": (h, torch.randn(d, f, device=dev, dtype=bf16)),
            "vocab": (x, torch.randn(v, d, device=dev, dtype=bf16)),
            # the same rows padded to a multiple of 8: what the projected loss runs on CUDA (CUDA_ALIGN_ROWS)
            "vocab_aligned": (x, torch.randn(v + (-v % 8), d, device=dev, dtype=bf16)),
        }
        for name, (a, w) in cases.items():
            fn = lambda a=a, w=w: F.linear(a, w)  # noqa: E731
            fn()
            ms = _sync_ms(check, fn, reps)
            out[f"gemm_{name}_{tag}_tflops"] = 2 * m * a.size(1) * w.size(0) / ms / 1e9
        fn = lambda dy=dy, x=x: dy.t() @ x  # noqa: E731
        fn()
        out[f"gemm_fc1_wgrad_{tag}_tflops"] = 2 * m * d * f / _sync_ms(check, fn, reps) / 1e9
        best = max([best] + [val for key, val in out.items() if key.endswith(f"{tag}_tflops")])
        x = h = dy = cases = None  # (freed before the next M)
    out["gemm_best_tflops"] = best
    out["gemm_best_fraction_of_peak"] = best * 1e12 / check.peak
    n = 2**23 if check.dry else 2**30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    out["copy_GBps"] = 2 * n / _sync_ms(check, lambda: b.copy_(a), reps) / 1e6
    if dev.type == "cuda":
        host = torch.empty(n, dtype=torch.uint8).pin_memory()
        b.copy_(host, non_blocking=True)
        ms = _sync_ms(check, lambda: b.copy_(host, non_blocking=True), reps)
        out["h2d_pinned_GBps"] = n / ms / 1e6
    return out


ALIGNS = (1, 8, 64, 128)  # none, the CUDA default (CUDA_ALIGN_ROWS), and Megatron's multiples


def stage_align(check: SpeedCheck) -> dict[str, Any]:
    """The vocabulary's products against the output weight zero-padded to a multiple of 1, 8, 64 and 128 rows
    (at V = 50,265: 50,265, 50,272, 50,304, 50,304; each width measured once), bf16: the loss's three GEMMs
    over 8,192 target rows (logits = h W^T, the input gradient g W, the weight gradient g^T h) in TFLOP/s;
    the projected loss's forward and backward (autocast, label smoothing 0.1, `align=`) in ms, its loss
    against the unpadded one's; one beam step's logits (256 rows: 64 sentences x beam 4) against the padded
    weight, the extra columns sliced off, as the static decoding step runs them (aligned_output_weight), in
    microseconds. The best multiple of each, and each against 8 (the default)."""
    from seqtrain.criterions.projected_loss import projected_nll_loss
    from seqtrain.cuda import padded_weight

    out = check.stage_figures
    dev, bf16 = check.device, torch.bfloat16
    d, v = (64, 1001) if check.dry else (1024, lib.BART_VOCAB)  # (dry: odd, so that 1 and 8 differ)
    rows, reps = (256, 2) if check.dry else (8192, 20)
    g = torch.Generator(device=dev).manual_seed(5)
    weight = (0.02 * torch.randn(v, d, device=dev, generator=g)).requires_grad_()
    hidden = torch.randn(rows, d, device=dev, generator=g).requires_grad_()
    target = torch.randint(0, v, (rows,), device=dev, generator=g)
    h16 = hidden.detach().to(bf16)
    step_x = torch.randn(256, d, device=dev, generator=g).to(bf16)
    out.update(vocab=v, rows=rows, dim=d)
    measured: dict[int, dict[str, float]] = {}
    for align in ALIGNS:
        width = v + (-v % align)
        out[f"align{align}_width"] = width
        if width not in measured:
            w = padded_weight(weight.detach(), align, bf16)
            dz = torch.randn(rows, width, device=dev, generator=g).to(bf16)
            fig: dict[str, float] = {}
            for name, fn in (
                ("fwd", lambda w=w: F.linear(h16, w)),
                ("dgrad", lambda w=w, dz=dz: dz @ w),
                ("wgrad", lambda dz=dz: dz.t() @ h16),
            ):
                fn()
                fig[f"gemm_{name}_tflops"] = 2 * rows * d * width / _sync_ms(check, fn, reps) / 1e9

            def loss_step(align: int = align) -> torch.Tensor:
                hidden.grad = weight.grad = None
                with torch.autocast(dev.type, dtype=bf16):
                    loss = projected_nll_loss(hidden, weight, target, 0.1, align=align)[0]
                loss.backward()
                return loss

            fig["loss"] = float(loss_step())
            fig["projected_loss_ms"] = _sync_ms(check, loss_step, reps)
            logits = lambda w=w: F.linear(step_x, w)[:, :v]  # noqa: E731
            logits()
            fig["decode_logits_us"] = 1000 * _sync_ms(check, logits, 5 * reps)
            measured[width] = fig
            del w, dz
        out.update({f"align{align}_{k}": val for k, val in measured[width].items() if k != "loss"})
    base = measured[v]["loss"]
    for align in ALIGNS:
        out[f"align{align}_loss_rel_diff"] = abs(measured[out[f"align{align}_width"]]["loss"] - base) / abs(
            base
        )
    for fig, name in (("projected_loss_ms", "projected_loss"), ("decode_logits_us", "decode_logits")):
        out[f"{name}_best_align"] = min(ALIGNS, key=lambda a: (out[f"align{a}_{fig}"], a))
        for align in ALIGNS:  # > 1: faster than the default
            out[f"align{align}_{name}_vs_align8"] = out[f"align8_{fig}"] / out[f"align{align}_{fig}"]
    bad = [a for a in ALIGNS if out[f"align{a}_loss_rel_diff"] > 1e-2]
    if bad:
        out["errors"] = [
            f"the projected loss at align {bad} differs from the unpadded one's by more than 1e-2"
        ]
    return out


def _attention_inputs(
    lq: list[int], lk: list[int], heads: int, dh: int, dev: torch.device, seed: int
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=dev).manual_seed(seed)

    def rnd(n: int) -> torch.Tensor:
        return torch.randn(n, heads, dh, device=dev, generator=g).to(torch.bfloat16)

    return rnd(sum(lq)), rnd(sum(lk)), rnd(sum(lk)), rnd(sum(lq))


def _rows(lengths: list[int]) -> tuple[torch.Tensor, int]:
    """For each packed row its row in a right-padded B x T layout, and T."""
    t = max(lengths)
    return torch.tensor([i * t + j for i, n in enumerate(lengths) for j in range(n)]), t


def _padded(x: torch.Tensor, rows: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """Packed N x H x d as the padded layout B x H x T x d (zeros at the pads)."""
    out = x.new_zeros(b * t, x.size(1), x.size(2)).index_copy_(0, rows.to(x.device), x)
    return out.view(b, t, x.size(1), x.size(2)).transpose(1, 2)


def _unpadded(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h, d).index_select(0, rows.to(x.device))


def _fwd_bwd(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], grad_out: torch.Tensor) -> tuple:
    o = fn(*inputs)
    return (o, *torch.autograd.grad(o, inputs, grad_out))


def _attention_case(
    check: SpeedCheck,
    fn: Callable[..., torch.Tensor],
    inputs: list[torch.Tensor],
    grad_out: torch.Tensor,
    to_cmp: Callable[[tuple], tuple],
    ref: tuple,
    flops: float,
    ctx: Callable[[], Any],
) -> dict[str, Any]:
    """ms of fwd+bwd, TFLOP/s, the output's and the gradients' error against the fp32 reference (largest
    difference / largest reference element) and whether two backward passes are bitwise equal."""
    reps = 2 if check.dry else 10
    with ctx():
        first = _fwd_bwd(fn, inputs, grad_out)
        second = _fwd_bwd(fn, inputs, grad_out)
        ms = _sync_ms(check, lambda: _fwd_bwd(fn, inputs, grad_out), reps)
    first = tuple(t.detach() for t in first)
    got = to_cmp(first)
    return {
        "ms": ms,
        "tflops": flops / ms / 1e9,
        "out_err": lib.rel_err(got[0], ref[0]),
        "grad_err": max(lib.rel_err(a, b) for a, b in zip(got[1:], ref[1:], strict=True)),
        "deterministic": all(torch.equal(a, b) for a, b in zip(first[1:], second[1:], strict=True)),
    }


def _fp32_reference(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], grad_out: torch.Tensor
) -> tuple:
    """`fn`'s output and gradients in fp32 (the math kernel, TF32 off)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        leaves = [x.detach().float().requires_grad_() for x in inputs]
        with sdpa_kernel([SDPBackend.MATH]):
            return tuple(t.detach() for t in _fwd_bwd(fn, leaves, grad_out.float()))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _kernels(check: SpeedCheck, *backends: Any) -> Callable[[], Any]:
    """A context that limits SDPA to `backends` on CUDA (nothing to choose on a CPU)."""
    from torch.nn.attention import sdpa_kernel

    return (lambda: sdpa_kernel(list(backends))) if check.device.type == "cuda" else nullcontext


def _equal_cases(check: SpeedCheck, b: int, tq: int, tk: int, causal: bool) -> dict[str, tuple]:
    """Equal lengths, every row at the longest, no mask (flash's ceiling; cuDNN at this one shape): flash's
    case and, on CUDA with a torch that has it, cuDNN's, as _attention_case takes them."""
    from torch.nn.attention import SDPBackend

    s, dev = check.shapes, check.device
    eq = [torch.randn(b, s.heads, n, s.head_dim, device=dev).to(torch.bfloat16) for n in (tq, tk, tk)]
    eq_g = torch.randn(b, s.heads, tq, s.head_dim, device=dev).to(torch.bfloat16)

    def equal_fn(q_, k_, v_):
        return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal)

    case = (
        equal_fn,
        eq,
        eq_g,
        lambda r: r,
        _fp32_reference(equal_fn, eq, eq_g),
        12 * b * tq * tk * s.heads * s.head_dim,
    )
    cases = {"flash_equal": (*case, _kernels(check, SDPBackend.FLASH_ATTENTION))}
    cudnn = getattr(SDPBackend, "CUDNN_ATTENTION", None)
    if dev.type == "cuda" and cudnn is not None:
        cases["cudnn_equal"] = (*case, _kernels(check, cudnn))
    return cases


def stage_attention(check: SpeedCheck) -> dict[str, Any]:
    """Attention alone, fwd+bwd, bf16, at the train batches' lengths. FLOPs: 3 x the forward's 4 Sq Sk H d
    over the real tokens (flops.py's convention: the whole square, causal too), so the variants compare at
    one count. Padded SDPA runs as seqtrain's padded path does (cuDNN attention off: flash, memory-efficient
    or math as torch picks); flash and cuDNN run on equal lengths (every row at the batch's longest)."""
    from torch.nn.attention import SDPBackend

    from seqtrain.models import varlen

    out = check.stage_figures
    s, dev, cuda = check.shapes, check.device, check.device.type == "cuda"
    lens = check.batches.get("attention")
    heads, dh = s.heads, s.head_dim
    out.update(pairs=len(lens["src"]), heads=heads, head_dim=dh)
    out["varlen_backend"] = "varlen_attn" if cuda and varlen.varlen_kernel() is not None else "reference"
    errors = []

    no_cudnn = _kernels(check, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    for kind, qs, ks, causal in (
        ("encoder_self", "src", "src", False),
        ("decoder_self", "tgt", "tgt", True),
        ("cross", "tgt", "src", False),
    ):
        lq, lk = lens[qs], lens[ks]
        b = len(lq)
        q, k, v, g = _attention_inputs(lq, lk, heads, dh, dev, seed=len(kind))
        real_flops = 3 * 4 * sum(x * y for x, y in zip(lq, lk)) * heads * dh
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (lq, lk))
        cu_q_dev, cu_k_dev = cu_q.to(dev), cu_k.to(dev)
        max_q, max_k = bucketed(max(lq)), bucketed(max(lk))

        def packed_ref(q_, k_, v_, cu_q=cu_q, cu_k=cu_k, causal=causal):
            return varlen.reference_attention(q_, k_, v_, cu_q, cu_k, causal)

        ref = _fp32_reference(packed_ref, [q, k, v], g)
        # varlen attention by seqtrain's dispatcher (torch's varlen kernel on CUDA)
        cases: dict[str, tuple] = {}

        def varlen_fn(q_, k_, v_, a=(cu_q_dev, cu_k_dev, max_q, max_k, causal), hosts=(cu_q, cu_k)):
            return varlen.varlen_attention(q_, k_, v_, *a, bounds_q=hosts[0], bounds_k=hosts[1])

        cases["varlen"] = (varlen_fn, [q, k, v], g, lambda r: r, ref, real_flops, nullcontext)
        # the padded layout with a boolean mask (True: may attend), what padded training runs
        (rows_q, tq), (rows_k, tk) = _rows(lq), _rows(lk)
        mask = (torch.arange(tk)[None, :] < torch.tensor(lk)[:, None]).view(b, 1, 1, tk)
        if causal:
            mask = mask & torch.ones(tq, tk, dtype=torch.bool).tril_()
        mask = mask.to(dev)
        padded = [_padded(x, r, b, t) for x, r, t in ((q, rows_q, tq), (k, rows_k, tk), (v, rows_k, tk))]

        def padded_fn(q_, k_, v_, mask=mask):
            return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)

        def padded_cmp(r, rows_q=rows_q, rows_k=rows_k):
            return (
                _unpadded(r[0], rows_q),
                _unpadded(r[1], rows_q),
                _unpadded(r[2], rows_k),
                _unpadded(r[3], rows_k),
            )

        cases["sdpa_padded"] = (
            padded_fn,
            padded,
            _padded(g, rows_q, b, tq),
            padded_cmp,
            ref,
            real_flops,
            no_cudnn,
        )
        cases.update(_equal_cases(check, b, tq, tk, causal))
        if "cudnn_equal" not in cases:
            out[f"cudnn_equal_{kind}_skipped"] = (
                "needs CUDA" if not cuda else "this torch has no cuDNN attention"
            )
        for name, (fn, inputs, grad_out, to_cmp, ref_, flops, ctx) in cases.items():
            try:
                inputs = [x.detach().requires_grad_() for x in inputs]
                res = _attention_case(check, fn, inputs, grad_out, to_cmp, ref_, flops, ctx)
                out.update({f"{name}_{kind}_{key}": val for key, val in res.items()})
            except Exception as e:  # one kernel failing leaves the others' figures
                # SDPA refused the call (torch 2.11: "No available kernel", later "No viable backend"): a
                # fact about the kernel, not a failure of the run
                if any(m in str(e) for m in ("No available kernel", "No viable backend")):
                    out[f"{name}_{kind}_skipped"] = f"kernel refused: {str(e)[:200]}"
                else:
                    errors.append(f"{name} {kind}: {type(e).__name__}: {str(e)[:300]}")
        if f"varlen_{kind}_ms" in out and f"sdpa_padded_{kind}_ms" in out:
            out[f"varlen_vs_padded_{kind}"] = out[f"sdpa_padded_{kind}_ms"] / out[f"varlen_{kind}_ms"]
        del q, k, v, g, padded, ref, cases
        _free(check)
    if errors:
        out["errors"] = errors
    return out


def _lever_cases(
    check: SpeedCheck, lens: list[int], seed: int
) -> tuple[dict[str, tuple], list[torch.Tensor], tuple]:
    """The encoder self-attention cases at one shape bucket (rows of `lens` tokens): varlen by seqtrain's
    dispatcher; the padded layout with a key-padding mask, off cuDNN and on it; equal lengths (every row at the
    bucket's width), flash and cuDNN. Each case as _attention_case takes it, and the packed inputs."""
    from torch.nn.attention import SDPBackend

    from seqtrain.models import varlen

    s, dev = check.shapes, check.device
    q, k, v, g = _attention_inputs(lens, lens, s.heads, s.head_dim, dev, seed=seed)
    b, flops = len(lens), 3 * 4 * sum(x * x for x in lens) * s.heads * s.head_dim
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    cu_dev, max_len = cu.to(dev), bucketed(max(lens))

    def packed_ref(q_, k_, v_):
        return varlen.reference_attention(q_, k_, v_, cu, cu, False)

    def varlen_fn(q_, k_, v_):
        return varlen.varlen_attention(
            q_, k_, v_, cu_dev, cu_dev, max_len, max_len, False, bounds_q=cu, bounds_k=cu
        )

    ref = _fp32_reference(packed_ref, [q, k, v], g)
    rows, t = _rows(lens)
    mask = (torch.arange(t)[None, :] < torch.tensor(lens)[:, None]).view(b, 1, 1, t).to(dev)
    padded = [_padded(x, rows, b, t) for x in (q, k, v)]

    def padded_fn(q_, k_, v_):
        return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)

    def padded_cmp(r):
        return tuple(_unpadded(x, rows) for x in r)

    no_cudnn = _kernels(check, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    cases = {
        "varlen": (varlen_fn, [q, k, v], g, lambda r: r, ref, flops, nullcontext),
        "sdpa_padded": (padded_fn, padded, _padded(g, rows, b, t), padded_cmp, ref, flops, no_cudnn),
        **_equal_cases(check, b, t, t, False),
    }
    if "cudnn_equal" in cases:  # (CUDA, and a torch with cuDNN attention)
        cases["cudnn_padded"] = (*cases["sdpa_padded"][:6], _kernels(check, SDPBackend.CUDNN_ATTENTION))
    return cases, [q, k, v], ref


def _first_call_ms(check: SpeedCheck, case: tuple) -> float:
    """ms of the first fwd+bwd at a new shape (cuDNN builds its plan for the shape there)."""
    fn, inputs, grad_out, *_, ctx = case
    with ctx():
        return _sync_ms(check, lambda: _fwd_bwd(fn, inputs, grad_out), 1)


def stage_attention_lever(check: SpeedCheck) -> dict[str, Any]:
    """The attention lever (issue 49): the encoder's self-attention, fwd+bwd, bf16, at shape buckets of 65,536
    token slots (rows of lengths within the bucket's last 64): varlen (seqtrain's packed path), masked SDPA off
    and on cuDNN, flash and cuDNN on equal lengths; the first call at each shape (cuDNN's plan is built there)
    apart from the steady ms. Per bucket cuDNN against varlen, the plan's cost and the calls that repay it; the
    sum of the plans over the buckets (what keeping a plan per bucket costs once). Then FA3 and FA4 through
    torch.nn.attention.activate_flash_attention_impl where the image has them: flash and varlen at the widest
    bucket with each active."""
    out = check.stage_figures
    dry = check.dry
    slots, widths = (512, (32, 64)) if dry else (65536, (256, 512, 768, 1024))
    out.update(
        token_slots=slots, widths=list(widths), heads=check.shapes.heads, head_dim=check.shapes.head_dim
    )
    errors, plan_ms = [], 0.0
    for width in widths:
        gen = torch.Generator().manual_seed(width)
        lens = [
            int(x) for x in torch.randint(max(1, width - 63), width + 1, (slots // width,), generator=gen)
        ]
        cases, packed, _ = _lever_cases(check, lens, seed=width)
        for name, (fn, inputs, *rest) in cases.items():
            key = f"{name}_w{width}"
            case = (fn, [x.detach().requires_grad_() for x in inputs], *rest)
            try:
                first = _first_call_ms(check, case)
                res = _attention_case(check, *case)
                out.update({f"{key}_{k}": v for k, v in res.items()})
                out[f"{key}_first_ms"] = first
            except Exception as e:
                if any(m in str(e) for m in ("No available kernel", "No viable backend")):
                    out[f"{key}_skipped"] = f"kernel refused: {str(e)[:200]}"
                else:
                    errors.append(f"{key}: {type(e).__name__}: {str(e)[:300]}")
        for cudnn_case in ("cudnn_padded", "cudnn_equal"):
            key = f"{cudnn_case}_w{width}"
            if f"{key}_ms" in out and f"varlen_w{width}_ms" in out:
                gain = out[f"varlen_w{width}_ms"] - out[f"{key}_ms"]
                build = max(0.0, out[f"{key}_first_ms"] - out[f"{key}_ms"])
                out[f"{key}_vs_varlen"] = out[f"varlen_w{width}_ms"] / out[f"{key}_ms"]
                out[f"{key}_plan_ms"] = build
                out[f"{key}_calls_to_repay_plan"] = build / gain if gain > 0 else math.inf
                plan_ms += build if cudnn_case == "cudnn_padded" else 0.0
        del cases, packed
        _free(check)
    if check.device.type == "cuda":
        out["cudnn_padded_plans_s_all_buckets"] = plan_ms / 1000
    else:
        out["cudnn_skipped"] = "needs CUDA"
    out.update(_flash_impls(check, widths[-1]))
    if errors:
        out["errors"] = errors
    return out


def _flash_impls(check: SpeedCheck, width: int) -> dict[str, Any]:
    """FA3 / FA4 activated in turn (torch.nn.attention.activate_flash_attention_impl; each needs its module:
    flash_attn_interface, flash_attn.cute) and, where that worked on CUDA, flash on equal lengths and varlen at
    `width`; the default (FA2) restored after each."""
    try:
        from torch.nn.attention import (
            activate_flash_attention_impl,
            list_flash_attention_impls,
            restore_flash_attention_impl,
        )
    except ImportError:
        return {"flash_impls": f"absent: torch {torch.__version__} has no activate_flash_attention_impl"}
    out: dict[str, Any] = {"flash_impls": list_flash_attention_impls()}
    slots = 512 if check.dry else 65536
    lens = [width] * (slots // width)
    for impl in out["flash_impls"]:
        try:
            activate_flash_attention_impl(impl)
        except Exception as e:  # (ImportError of its module, or the device refused)
            out[f"{impl}_activation"] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        try:
            out[f"{impl}_activation"] = "ok"
            if check.device.type != "cuda":
                continue
            cases, _, _ = _lever_cases(check, lens, seed=7)
            for name in ("flash_equal", "varlen"):
                fn, inputs, *rest = cases[name]
                res = _attention_case(check, fn, [x.detach().requires_grad_() for x in inputs], *rest)
                out.update({f"{impl}_{name}_w{width}_{k}": v for k, v in res.items()})
        except Exception as e:
            out[f"{impl}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            restore_flash_attention_impl()
    return out


def _large_trainer(check: SpeedCheck) -> Any:
    """bart_large's trainer (bf16) for the packed and merged stages, made once."""
    if "trainer" not in check.cache:
        check.cache["trainer"] = lib.make_trainer(check.dry, check.shapes.large, check.shapes.vocab, "bf16")[
            0
        ]
    return check.cache["trainer"]


def _pass(trainer: Any, sample: dict[str, Any]) -> torch.Tensor:
    """One forward and backward pass of a batch already on the device, as the trainer runs it; the summed loss
    (a device tensor). Gradients add up in the parameters' .grad."""
    loss, _, _ = trainer.task.train_step(
        sample, trainer._forward_model, trainer.criterion, trainer.step_context(), 0
    )
    return loss.detach().float()


def _passes(trainer: Any, samples: list[dict[str, Any]]) -> torch.Tensor:
    trainer.model.zero_grad(set_to_none=True)
    return torch.stack([_pass(trainer, trainer.prepare_sample(s)) for s in samples]).sum()


def stage_packed_vs_padded(check: SpeedCheck) -> dict[str, Any]:
    """The first batch of an update under the preset (~16k tokens), packed and padded: summed loss and
    gradients of one forward and backward pass, ms of one (the batch already on the device)."""
    import bench_packing

    out = check.stage_figures
    trainer = _large_trainer(check)
    sample = check.batches.get("update")["update"][0]
    reps = 1 if check.dry else 3
    results = {}
    for name, s in (("packed", sample), ("padded", bench_packing.without_layout(sample))):
        dev_sample = trainer.prepare_sample(s)
        trainer.model.zero_grad(set_to_none=True)
        loss = float(_pass(trainer, dev_sample))
        results[name] = (loss, _grads(trainer.model))
        out[f"{name}_ms"] = _sync_ms(check, lambda d=dev_sample: _pass(trainer, d), reps)
        out[f"{name}_loss"] = loss
    out["tokens"] = lib.real_tokens([sample])
    out["loss_rel_diff"] = abs(results["packed"][0] - results["padded"][0]) / abs(results["padded"][0])
    out["grad_rel_err"] = _grad_rel_err(results["packed"][1], results["padded"][1])
    out["packed_vs_padded_speedup"] = out["padded_ms"] / out["packed_ms"]
    trainer.model.zero_grad(set_to_none=True)
    if out["loss_rel_diff"] > 1e-2:
        out["errors"] = [f"packed and padded losses differ by {out['loss_rel_diff']:.3g} (> 1e-2)"]
    return out


def stage_merged_update(check: SpeedCheck) -> dict[str, Any]:
    """One update of the preset's batches as its passes (merge_update under --merge-max-tokens = max-tokens
    x update-freq: one pass) against one pass per batch: summed loss and gradients, ms of the update's passes
    (host-to-device copies and, merged, the merge itself included)."""
    out = check.stage_figures
    trainer = check.cache.pop("trainer", None)
    trainer = _large_trainer(check) if trainer is None else trainer
    built = check.batches.get("update")
    ds, update, limit = built["ds"], built["update"], check.shapes.merge_tokens
    merged = ds.merge_update(update, limit)
    out.update(
        batches=len(update), passes=len(merged), merge_max_tokens=limit, tokens=lib.real_tokens(update)
    )
    out["padded_slots_separate"] = sum(r * w for r, w in map(padded_shape, update))
    out["padded_slots_merged"] = sum(r * w for r, w in map(padded_shape, merged))
    acc_loss = float(_passes(trainer, update))
    acc_grads = _grads(trainer.model)
    merged_loss = float(_passes(trainer, merged))
    out["loss_rel_diff"] = abs(merged_loss - acc_loss) / abs(acc_loss)
    out["grad_rel_err"] = _grad_rel_err(_grads(trainer.model), acc_grads)
    del acc_grads
    reps = 1 if check.dry else 2
    out["accumulated_ms"] = _sync_ms(check, lambda: _passes(trainer, update), reps)
    out["merged_ms"] = _sync_ms(check, lambda: _passes(trainer, ds.merge_update(update, limit)), reps)
    out["merged_speedup"] = out["accumulated_ms"] / out["merged_ms"]
    bad = [k for k, tol in (("loss_rel_diff", 1e-2), ("grad_rel_err", 5e-2)) if not out[k] <= tol]
    if bad:
        out["errors"] = [
            f"merged and accumulated passes differ: {', '.join(f'{k}={out[k]:.3g}' for k in bad)}"
        ]
    return out


def _train_variant(check: SpeedCheck, label: str, arch: str, variant: str) -> dict[str, Any]:
    """Train updates of the preset's batches with one variant: accum (one pass per batch), merged (the
    update's batches merged into one pass), compiled (merged, --compile)."""
    from torch._dynamo.utils import counters

    from seqtrain.models import transformer

    s = check.shapes
    train = check.batches.get("train")
    ds, updates = train["ds"], train["updates"]
    if variant == "compiled":
        torch._dynamo.reset()
        transformer._compiled.cache_clear()
        counters.clear()
    trainer, _ = lib.make_trainer(
        check.dry, arch, s.vocab, "bf16", *(("--compile",) if variant == "compiled" else ())
    )
    if variant == "compiled" and check.dry:
        transformer.compile_layers(trainer.model, backend="eager")  # dynamo without inductor's C++ build
    if variant == "accum":  # the initial weights, for transformers' twin
        check.cache[f"state:{label}"] = {
            k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()
        }
        check.cache[f"targs:{label}"] = argparse.Namespace(**trainer.run_args)
    counter = Seq2SeqFlops.from_model(trainer.model)

    def step(update: list[dict[str, Any]]) -> dict[str, float] | None:
        passes = update if variant == "accum" else ds.merge_update(update, s.merge_tokens)
        return trainer.train_step(passes)

    _free(check)
    res: dict[str, Any] = {}
    first_s, stats = gpu_check.timed(check, lambda: step(updates[0]))
    res["loss0"] = stats["loss"] * math.log(2)  # base 2 -> nats, as transformers reports it
    res["first_update_s"] = first_s
    res["warmup_s"] = [first_s] + [
        gpu_check.timed(check, lambda u=u: step(u))[0] for u in updates[1 : s.warmup]
    ]
    frames = counters["frames"].get("ok", 0)
    timed = updates[s.warmup : s.warmup + s.timed]
    times = [gpu_check.timed(check, lambda u=u: step(u))[0] for u in timed]
    res["peak_gib"] = gpu_check.peak_memory(check)
    total = sum(times)
    res["tokens_per_update"] = sum(lib.real_tokens(u) for u in timed) / len(timed)
    res["tokens_per_s"] = sum(lib.real_tokens(u) for u in timed) / total
    res["ms_per_update"] = 1000 * statistics.median(times)
    flops = sum(counter.sample_train_flops(b, lib.PAD) for u in timed for b in u)
    res["mfu"] = flops / total / check.peak
    res["passes_per_update"] = (
        len(ds.merge_update(timed[0], s.merge_tokens)) if variant != "accum" else len(timed[0])
    )
    if variant == "compiled":
        res["compile_s"] = first_s - statistics.median(times)
        res["frames_compiled"] = frames
        res["second_shape_s"] = gpu_check.timed(check, lambda: step(train["second"]))[0]
        res["recompiles_second_shape"] = counters["frames"].get("ok", 0) - frames
        res["graph_breaks"] = sum(counters["graph_break"].values())
        res["unique_graphs"] = counters["stats"].get("unique_graphs", 0)
    profiled = updates[s.warmup + s.timed :]
    prof = lib.profile_steps(
        check.device,
        [lambda u=u: step(u) for u in profiled],
        os.path.join(check.out, f"profile_{label}_{variant}.txt"),
    )
    res.update({f"profile_{k}": v for k, v in prof.items()})
    return res  # (the trainer goes with this frame; the caller frees the device)


def stage_train_ab(check: SpeedCheck) -> dict[str, Any]:
    """bart_large then bart_base, each variant as the budget allows (what is left is named, not guessed)."""
    out = check.stage_figures
    s = check.shapes
    errors = []
    # seconds a variant needs on the GPU before it starts: model build, 8 updates, profile; compiles on top
    needs = {"accum": 20, "merged": 15, "compiled": 75}
    for label, arch in (("bart_large", s.large), ("bart_base", s.base)):
        if check.dry and label == "bart_base":  # (both bart_tiny in a dry run: seconds of CI for nothing new)
            out["bart_base_skipped"] = "dry run: bart_large's code at the same tiny model"
            continue
        out[f"{label}_arch"] = arch
        for variant in ("accum", "merged", "compiled"):
            need = needs[variant] * (0.6 if label == "bart_base" else 1.0)
            if check.left() < check.need(need):
                out[f"{label}_{variant}_skipped"] = f"budget: {check.left():.0f} s left of the stage's"
                continue
            try:
                res = _train_variant(check, label, arch, variant)
                out.update({f"{label}_{variant}_{k}": v for k, v in res.items()})
            except Exception as e:
                errors.append(f"{label} {variant}: {type(e).__name__}: {str(e)[:400]}")
                out[f"{label}_{variant}_traceback"] = traceback.format_exc()[-1500:]
            _free(check)
        ran = [v for v in ("accum", "merged", "compiled") if f"{label}_{v}_tokens_per_s" in out]
        if ran:
            best = max(ran, key=lambda v: out[f"{label}_{v}_tokens_per_s"])
            out[f"{label}_best_variant"] = best
            out[f"{label}_best_tokens_per_s"] = out[f"{label}_{best}_tokens_per_s"]
            out[f"{label}_best_mfu"] = out[f"{label}_{best}_mfu"]
        for a, b in (("merged", "accum"), ("compiled", "merged")):
            if f"{label}_{a}_tokens_per_s" in out and f"{label}_{b}_tokens_per_s" in out:
                out[f"{label}_{a}_vs_{b}"] = (
                    out[f"{label}_{a}_tokens_per_s"] / out[f"{label}_{b}_tokens_per_s"]
                )
        for v in ("merged", "compiled"):  # the same first update on the same weights: the same loss
            if f"{label}_{v}_loss0" in out and f"{label}_accum_loss0" in out:
                diff = (
                    abs(out[f"{label}_{v}_loss0"] - out[f"{label}_accum_loss0"]) / out[f"{label}_accum_loss0"]
                )
                out[f"{label}_{v}_loss0_rel_diff"] = diff
                if diff > 1e-2:
                    errors.append(f"{label} {v}: step-0 loss differs from accum's by {diff:.3g}")
    if errors:
        out["errors"] = errors
    return out


def stage_determinism(check: SpeedCheck) -> dict[str, Any]:
    """The registration point of scripts/gpu/stage_determinism.py (another change writes it): its
    stage_determinism(check), on this run's Check, when the file is there."""
    if not os.path.exists(os.path.join(HERE, "stage_determinism.py")):
        return {"skip": "not present", "skip_reason": "scripts/gpu/stage_determinism.py is not in this tree"}
    from stage_determinism import stage_determinism as run

    return run(check)


SERVE_BENCH = os.path.join(gpu_check.REPO, "scripts", "bench", "bench_serve.py")


def stage_serve(check: SpeedCheck) -> dict[str, Any]:
    """seqtrain-serve's throughput on the GPU (issue 52's benchmark, the same as on the CPU), when
    scripts/bench/bench_serve.py is in the tree: run with --serve-args if given, else with `--device cuda` and
    `--quick` where its --help offers them, within what is left of the stage's budget, $OUT/serve its OUT;
    its exit status, seconds and the last lines of its output (its table). A dry run asks only for its --help
    and records the arguments the GPU run would pass."""
    import shlex
    import subprocess

    if not os.path.exists(SERVE_BENCH):
        return {
            "skip": "not present",
            "skip_reason": "scripts/bench/bench_serve.py is not in this tree (issue 52)",
        }
    out = check.stage_figures
    cmd = [sys.executable, SERVE_BENCH]
    helped = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60, cwd=gpu_check.REPO)
    offered = set(re.findall(r"--[a-z][a-z0-9-]*", helped.stdout))
    out["help_rc"] = helped.returncode
    if check.serve_args is not None:
        args = shlex.split(check.serve_args)
    else:
        args = [
            *(["--device", "cuda"] if "--device" in offered else []),
            *(["--quick"] if "--quick" in offered else []),
        ]
    out["args"] = " ".join(args)
    if helped.returncode != 0:
        raise RuntimeError(f"bench_serve.py --help exited {helped.returncode}: {helped.stderr[-500:]}")
    if check.dry:
        return {"skip": "dry run", "skip_reason": "dry run: --help only (the GPU run runs the benchmark)"}
    env = {**os.environ, "OUT": os.path.join(check.out, "serve")}
    start = time.monotonic()
    proc = subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=max(10.0, check.left() - 5),
        cwd=gpu_check.REPO,
        env=env,
    )
    out.update(rc=proc.returncode, seconds_run=time.monotonic() - start, output_tail=proc.stdout[-4000:])
    if proc.returncode != 0:
        out["errors"] = [f"bench_serve.py exited {proc.returncode}: {proc.stderr[-600:]}"]
    return out


# (name, function, budget seconds on a GPU, in a dry run), in the order they run
STAGES: list[tuple[str, Callable[[SpeedCheck], dict[str, Any]], float, float]] = [
    ("env", stage_env, 5, 0),
    ("ceilings", stage_ceilings, 15, 2),
    ("align", stage_align, 12, 3),
    ("attention", stage_attention, 25, 3),
    ("packed_vs_padded", stage_packed_vs_padded, 25, 3),
    ("merged_update", stage_merged_update, 20, 3),
    ("train_ab", stage_train_ab, 180, 20),
    ("determinism", stage_determinism, 60, 5),
    ("train_fair_large", stage_fair.stage_train_fair_large, 220, 20),
    ("generate_fair", stage_fair.stage_generate_fair, 140, 15),
    ("train_fair_base", stage_fair.stage_train_fair_base, 125, 20),
    ("attention_lever", stage_attention_lever, 20, 5),
    ("serve", stage_serve, 25, 10),
]
# seconds a GPU run spends before its first stage (interpreter, torch, transformers and seqtrain imports, the
# device's context): what --plan adds to the stages' budgets
STARTUP_S = 15


def plan(stages: list[str], budget: float) -> tuple[str, bool]:
    """The wanted stages in the order they run, their GPU budgets and the running total (startup included),
    against the run's `budget`: (the table, whether the whole plan fits). A stage that no longer fits when its
    turn comes is skipped, so the run never overruns; the plan says whether every stage gets its full budget."""
    total, lines = (
        float(STARTUP_S),
        ["| stage | budget s | total s |", "|---|---|---|", f"| (startup) | {STARTUP_S} | {STARTUP_S} |"],
    )
    for name, _, gpu_budget, _ in STAGES:
        if name in stages:
            total += gpu_budget
            lines.append(f"| {name} | {gpu_budget:g} | {total:g} |")
    fits = total <= budget
    lines += [
        "",
        f"{total:g} s of the run's budget {budget:.0f} s: "
        f"{'fits' if fits else 'DOES NOT FIT (the last stages would be skipped)'}; "
        f"gpu_speed.sh's TIMEOUT >= {math.ceil(total) + 15} (the device probe, ~5 s, and 10 s of margin), "
        f"the device call's timeout_s >= TIMEOUT + 15",
    ]
    return "\n".join(lines) + "\n", fits


# ------------------------------------------------------------------------------------------------ report
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def report(results: dict[str, Any]) -> str:
    """The judged figures against their targets, then every stage's scalar figures, then the top kernels."""
    stages = results["stages"]
    lines = [
        f"# GPU speed run ({'dry run, CPU' if results.get('dry_run') else 'GPU'}; budget {results.get('budget_s')} s)",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
    ]
    for stage, key, op, target in JUDGED:
        value = stages.get(stage, {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            met = "yes" if (value >= target if op == ">=" else value <= target) else "NO"
        else:
            value, met = "-", "not measured"
        lines.append(f"| {stage}.{key} | {_fmt(value)} | {op} {target:g} | {met} |")
    lines += ["", "| stage | status | s (budget) | figures |", "|---|---|---|---|"]
    for name, res in stages.items():
        figs = [
            f"{k}={_fmt(v)}"
            for k, v in res.items()
            if k not in ("status", "seconds", "budget_s")
            and not isinstance(v, (list, dict))
            and not k.endswith("traceback")
        ]
        errors = res.get("errors") or []
        figs += [f"ERROR {e}" for e in errors]
        lines.append(
            f"| {name} | {res['status']} | {res.get('seconds', 0):.0f} ({res.get('budget_s', 0):g}) | "
            f"{'; '.join(figs).replace('|', '/')} |"
        )
    tops = [(k, v) for k, v in stages.get("train_ab", {}).items() if k.endswith("profile_top") and v]
    if tops:
        lines += ["", "## Top kernels per training step (train_ab, profiled)"]
        for key, top in tops:
            lines += ["", f"{key.removesuffix('_profile_top')}:", *[f"- {t}" for t in top]]
    lines += _fair_tables(stages)
    return "\n".join(lines) + "\n"


# (stage, prefixes, the samples' unit, the rate figure) of the fair comparisons' tables
FAIR_TABLES = (
    ("train_fair_large", ("bart_large_",), "ms", "tokens_per_s"),
    ("train_fair_base", ("bart_base_",), "ms", "tokens_per_s"),
    ("generate_fair", ("bf16_", "fp32_"), "s", "sentences_per_s"),
)


def _fair_tables(stages: dict[str, Any]) -> list[str]:
    """One table per fair comparison: each engine's median, quartiles and range, rate, MFU (training), cuDNN
    switch and preparation seconds; the toolkits' best and the speedup with its per-round range; the engines
    left out and why. What docs/benchmarks.md takes."""
    lines = []
    for stage, prefixes, unit, rate in FAIR_TABLES:
        res = stages.get(stage, {})
        for p in prefixes:
            engines = res.get(f"{p}engines")
            if not engines:
                continue
            head = f"## {stage}, {p.rstrip('_')}: {res.get(f'{p}rounds')} rounds"
            if f"{p}speedup" in res:
                head += (
                    f"; seqtrain's best {res[f'{p}seqtrain_best']} against transformers' best "
                    f"{res[f'{p}transformers_best']}: {res[f'{p}speedup']:.3g}x (rounds "
                    f"{res.get(f'{p}speedup_rounds_min', 0):.3g}-{res.get(f'{p}speedup_rounds_max', 0):.3g})"
                )
            lines += [
                "",
                head,
                "",
                f"| engine | median {unit} | q1-q3 | min-max | {rate} | MFU | cuDNN | prepare s |",
            ]
            lines.append("|---|---|---|---|---|---|---|---|")
            for e in engines:
                k = f"{p}{e}"
                if f"{k}_{unit}_median" not in res:
                    lines.append(f"| {e} | failed: {res.get(f'{k}_failed', '?')} | | | | | | |")
                    continue
                lines.append(
                    f"| {e} | {_fmt(res[f'{k}_{unit}_median'])} | {_fmt(res[f'{k}_{unit}_q1'])}-"
                    f"{_fmt(res[f'{k}_{unit}_q3'])} | {_fmt(res[f'{k}_{unit}_min'])}-{_fmt(res[f'{k}_{unit}_max'])} | "
                    f"{_fmt(res.get(f'{k}_{rate}', '-'))} | {_fmt(res.get(f'{k}_mfu', '-'))} | "
                    f"{res.get(f'{k}_cudnn_sdp', '-')} | {_fmt(res.get(f'{k}_prepare_s', '-'))} |"
                )
            lines += [f"- left out: {key.removeprefix(p).removesuffix('_skipped')}: {why}"
                      for key, why in res.items() if key.startswith(p) and key.endswith("_skipped")]  # fmt: skip
    return lines


# ------------------------------------------------------------------------------------------------ runner
def _flags() -> tuple[Any, ...]:
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.cuda.flash_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        torch.backends.cuda.math_sdp_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def _restore(flags: tuple[Any, ...]) -> None:
    """The process-wide switches a stage may change (a Trainer sets TF32 and cuDNN attention; a determinism
    check sets deterministic algorithms), as they were before it."""
    mm, cudnn_tf32, cudnn_sdp, flash, mem, math_sdp, det, warn = flags
    torch.backends.cuda.matmul.allow_tf32 = mm
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    torch.backends.cuda.enable_flash_sdp(flash)
    torch.backends.cuda.enable_mem_efficient_sdp(mem)
    torch.backends.cuda.enable_math_sdp(math_sdp)
    torch.use_deterministic_algorithms(det, warn_only=warn)


def _watchdog(check: SpeedCheck, grace: float) -> threading.Timer:
    """At the run's deadline plus `grace`: the running stage marked as stopped (its figures so far kept), the
    results saved, the process ended with 124 (what timeout(1) reports)."""

    def fire() -> None:
        try:
            name = check.current
            if name is not None:
                check.results["stages"][name] = {
                    "status": "failed",
                    "seconds": time.monotonic() - check.stage_start,
                    "budget_s": check.stage_budget,
                    **dict(check.stage_figures),
                    "error": "stopped: the run's time budget ran out in this stage",
                }
            check.results["stopped"] = "time budget"
            for _ in range(3):  # (the main thread may be changing the results at this moment)
                try:
                    check.save()
                    break
                except RuntimeError:
                    time.sleep(0.2)
            print(f"gpu_speed.py: stopped at the time budget in stage {name}", file=sys.stderr, flush=True)
        finally:
            os._exit(124)

    timer = threading.Timer(max(1.0, check.deadline - time.monotonic() + grace), fire)
    timer.daemon = True
    timer.start()
    return timer


def run_stage(
    check: SpeedCheck, name: str, fn: Callable[[SpeedCheck], dict[str, Any]], budget: float
) -> dict:
    left = check.deadline - time.monotonic()
    if left < budget:
        return {
            "status": "skipped: budget",
            "seconds": 0.0,
            "budget_s": budget,
            "skip_reason": f"needs ~{budget:g} s, {max(left, 0):.0f} s of the run left",
        }
    waited = check.batches.settle() if name != "env" else 0.0  # (its time counts in the stage's)
    check.current, check.stage_figures, check.stage_budget = name, {}, budget
    check.stage_start = time.monotonic() - waited
    check.stage_deadline = min(check.deadline, check.stage_start + budget)
    flags = _flags()
    cudnn_at_start = torch.backends.cuda.cudnn_sdp_enabled()
    if name != "merged_update":  # (the bart_large trainer packed_vs_padded leaves it)
        check.cache.pop("trainer", None)
    try:
        res = fn(check)
        res = {**check.stage_figures, **res}
        if "skip_reason" in res:
            status = f"skipped: {res.pop('skip', res['skip_reason'])}"
        else:
            status = "failed" if res.get("errors") else "ok"
    except Exception as e:  # a failed stage is reported and the next one runs
        res = {
            **check.stage_figures,
            "error": f"{type(e).__name__}: {e}"[:2000],
            "traceback": traceback.format_exc()[-3000:],
        }
        status = "failed"
    finally:
        _restore(flags)
        check.current = None
        if name != "packed_vs_padded":  # (the bart_large trainer it shares with merged_update)
            check.cache.pop("trainer", None)
        _free(check)
    head = {
        "status": status,
        "seconds": time.monotonic() - check.stage_start,
        "budget_s": budget,
        "cudnn_sdp_at_start": cudnn_at_start,
        "batches_wait_s": waited,
    }
    return {**head, **{k: v for k, v in res.items() if k not in head}}  # (a stage cannot set its own status)


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """The run; its budget counts from `started` (time.monotonic(); default: now)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every stage on the CPU with tiny shapes")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-speed-out", help="folder for the results")
    p.add_argument("--stages", default=",".join(n for n, *_ in STAGES), help="comma list of stages to run")
    p.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s for MFU")
    p.add_argument("--budget", type=float, default=545.0, help="seconds for the whole run (default 545)")
    p.add_argument(
        "--plan", action="store_true", help="print the stages' budgets against --budget; run nothing"
    )
    p.add_argument(
        "--dry-compile", action="store_true", help="in a dry run, also compile transformers' model (slow)"
    )
    p.add_argument("--serve-args", default=None, help="arguments for scripts/bench/bench_serve.py (serve)")
    args = p.parse_args(argv)
    wanted = args.stages.split(",")
    unknown = [w for w in wanted if w not in {n for n, *_ in STAGES}]
    if unknown:
        print(f"gpu_speed.py: error: --stages: unknown {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.plan:
        text, fits = plan(wanted, args.budget)
        print(text, end="")
        return 0 if fits else 1
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_speed.py: error: no CUDA device; pass --dry-run to check the plumbing on the CPU",
            file=sys.stderr,
        )
        return 1
    args.started = started
    check = SpeedCheck(args)
    watchdog = _watchdog(check, grace=5.0)
    failed = []
    for name, fn, gpu_budget, dry_budget in STAGES:
        if name not in wanted:
            continue
        print(f"==== [{time.strftime('%H:%M:%S')}] {name}", flush=True)
        res = run_stage(check, name, fn, dry_budget if check.dry else gpu_budget)
        if res["status"] == "failed":
            failed.append(name)
        check.results["stages"][name] = res
        print(
            json.dumps({k: v for k, v in res.items() if not k.endswith("traceback")}, default=float),
            flush=True,
        )
        check.save()
    watchdog.cancel()
    check.batches.close()
    check.results["seconds"] = time.monotonic() - check.start
    check.save()
    print(report(check.results))
    print(
        f"gpu_speed.py: {'FAILED stages: ' + ', '.join(failed) if failed else 'no stage failed'}; "
        f"results in {check.out}/gpu_speed.json and gpu_speed.md"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(started=STARTED))
