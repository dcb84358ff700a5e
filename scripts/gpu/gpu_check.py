#!/usr/bin/env python
"""One-shot proof of the GPU path, run by scripts/gpu/gpu_check.sh: about 10 minutes on one
GPU, with only what the GPU image has (torch with CUDA, transformers, sentencepiece, pytest; no rouge-score,
nltk or network). Writes $OUT/gpu_check.json (every stage's figures, written again after each stage so a
timeout keeps what ran) and $OUT/gpu_check.md (a table, targets beside the figures). Stages:

  env          device, torch, CUDA, the peak FLOP/s the MFU figures use
  cuda_tests   pytest -m cuda tests (tests needing rouge-score skip)
  numerics     fp16/bf16 of the custom autograd functions (the FFN; the projected loss at V = 50,265 under
               a 2^15 loss scale) against plain autograd / full logits and fp64
  sync_count   the sync-count test (tests/test_sync*.py; it runs under torch.cuda.set_sync_debug_mode
               ("error") on CUDA), when the tree has one
  train_speed  bart_base and bart_large, random weights copied into transformers'
               BartForConditionalGeneration, bf16 autocast, fused AdamW, CNN/DM-like batches (~1k-token
               sources, ~16k source tokens a step): non-padding tokens/s, ms/step, peak memory, MFU, step-0
               loss of both
  fp16_resume  fp16 training saved at update k and resumed: parameters and loss scale equal to the unbroken
               run
  oom          a batch that runs out of memory (under a memory cap) is split and its update kept
  generate     beam search against transformers' generate, same weights: sentences/s, identical best
               hypotheses (fp32), and the same in bf16 (under autocast, and with bf16 weights as
               seqtrain-generate --bf16 runs)
  generate_static  the static decoding path (CUDA graphs, finished on the device) in bf16 weights against the
               eager loop and transformers' bf16 generate: sentences/s, capture seconds, agreement with the eager
               loop; fp32 best hypotheses identical to transformers' and the eager loop's on 64 sentences, and
               fp32 sentences/s of the static path and transformers' generate on them
  generate_packed  generation's encoder pass packed (--packed-encoder) against padded in bf16 weights, unsorted
               CNN/DM-like sources: encoder ms per batch both ways, the largest output difference, whether the
               default packs; best hypotheses packed and padded (fp32 identical, bf16 agreement)
  compile      the training step under torch.compile: graph breaks, ms/step against eager

--dry-run runs every stage on the CPU with tiny shapes (bf16 for fp16, which needs CUDA; the OOM stage needs
CUDA and is skipped), so CI tests the plumbing (tests/repo/test_gpu_check.py).
Targets (one H100/H200, bf16): bart_large training >= 40% MFU and >= 1.5x transformers' tokens/s;
generation >= 2x transformers' generate (the static path against transformers' bf16 generate).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts", "gpu"))
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))  # the generate stage reuses bench_generate.py

import gpu_check_lib as lib  # noqa: E402
from stage_determinism import determinism_settings, restore_determinism_settings  # noqa: E402

from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.train.flops import Seq2SeqFlops, device_peak_flops, measured_matmul_peak  # noqa: E402
from seqtrain.train.trainer import Trainer  # noqa: E402

DEFAULT_CUDNN_SDP = torch.backends.cuda.cudnn_sdp_enabled()  # torch's default, before any Trainer sets it
TARGETS = {"mfu_bart_large": 0.40, "train_speedup_bart_large": 1.5, "generate_speedup": 2.0}


class Check:
    """The run's settings and its results file."""

    def __init__(self, args: argparse.Namespace):
        self.dry = args.dry_run
        self.device = torch.device("cpu" if self.dry else "cuda")
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.results: dict[str, Any] = {"dry_run": self.dry, "stages": {}}
        # the figures MFU is taken against: the table's bf16 peak on a known GPU, else this device's measured
        # one
        self.peak = device_peak_flops(self.device, torch.bfloat16, args.peak_flops)
        self.peak_source = "table or --peak-flops"
        if self.peak is None:
            self.peak = measured_matmul_peak(self.device, torch.bfloat16, n=512 if self.dry else 4096)
            self.peak_source = "measured bf16 matmul"

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def save(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "gpu_check.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(self.results, f, indent=1, default=float)
        os.replace(path + ".tmp", path)


# ------------------------------------------------------------------------------------------------ helpers
def peak_memory(check: Check) -> float:
    """GiB: the device's peak allocation since the last reset; on the CPU the process's peak RSS."""
    if check.device.type == "cuda":
        return torch.cuda.max_memory_allocated(check.device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_memory(check: Check) -> None:
    if check.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(check.device)


def timed(check: Check, fn: Callable[[], Any]) -> tuple[float, Any]:
    check.sync()
    start = time.perf_counter()
    out = fn()
    check.sync()
    return time.perf_counter() - start, out


# ------------------------------------------------------------------------------------------------ stages
def stage_env(check: Check) -> dict[str, Any]:
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(check.device),
        "peak_flops": check.peak,
        "peak_source": check.peak_source,
    }
    if check.device.type == "cuda":
        p = torch.cuda.get_device_properties(check.device)
        out.update(
            name=p.name, memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}"
        )
    return out


def _pytest(
    check: Check, args: list[str], log: str, timeout: int
) -> tuple[int, str, dict[str, int], list[str]]:
    """Run pytest on `args` in the repo, its whole output (tracebacks included) kept in $OUT/`log`: (exit
    code, summary line, counts by outcome, the FAILED/ERROR lines)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    with open(os.path.join(check.out, log), "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", tail)}
    failures = [ln[:300] for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return proc.returncode, tail, counts, failures


def stage_cuda_tests(check: Check) -> dict[str, Any]:
    code, tail, counts, failures = _pytest(check, ["-m", "cuda", "tests"], "cuda_tests.log", 300)
    out = {
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "errors": counts.get("error", 0) + counts.get("errors", 0),
        "skipped": counts.get("skipped", 0),
        "deselected": counts.get("deselected", 0),
        "summary": tail,
        "failures": failures,
    }
    if code not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest -m cuda exited {code}: {tail}; {' | '.join(failures)}")
    return out


def stage_numerics(check: Check) -> dict[str, Any]:
    """Tolerances are tests/unit/criterions/test_projected_loss.py's: vs the same precision 1e-3 (fp16) /
    1e-2 (bf16) of the largest gradient element, vs fp64 2e-3 / 2e-2."""
    out: dict[str, Any] = {}
    bad = []
    for name, dtype, tol_same, tol_64 in (
        ("fp16", torch.float16, 1e-3, 2e-3),
        ("bf16", torch.bfloat16, 1e-2, 2e-2),
    ):
        out[f"ffn_{name}_grad_rel_err"] = lib.ffn_error(check.device, check.dry, dtype)
        loss = lib.loss_errors(check.device, check.dry, dtype)
        out.update({f"loss_{name}_{k}": v for k, v in loss.items()})
        vs_full = max(loss["grad_h_rel_err_vs_full"], loss["grad_w_rel_err_vs_full"])
        if (
            loss["loss_rel_err_vs_full"] > 1e-5
            or not loss["grad_finite"]
            or (loss["full_grad_finite"] and not vs_full <= tol_same)
            or not max(loss["grad_h_rel_err_vs_fp64"], loss["grad_w_rel_err_vs_fp64"]) <= tol_64
        ):
            bad.append(f"projected loss {name}")
        if out[f"ffn_{name}_grad_rel_err"] > 2 * tol_64:
            bad.append(f"FFN {name}")
    if bad:
        raise RuntimeError(f"outside tolerance: {', '.join(bad)}: {out}")
    return out


def stage_sync_count(check: Check) -> dict[str, Any]:
    tests = [t for t in ("tests/unit/train/test_sync_free.py",) if os.path.exists(os.path.join(REPO, t))]
    if not tests:
        return {"skip_reason": "no sync-count test (tests/unit/train/test_sync_free.py) in this tree"}
    code, tail, counts, failures = _pytest(check, tests, "sync_count.log", 240)
    if code != 0:
        raise RuntimeError(f"{' '.join(tests)}: {tail}; {' | '.join(failures)}")
    return {
        "tests": tests,
        "passed": counts.get("passed", 0),
        "skipped": counts.get("skipped", 0),
        "summary": tail,
    }


def _train_toolkit(
    check: Check,
    step: Callable[[Any], float],
    pairs: list[Any],
    warmup: int,
    prepare: Callable[[Any], Any],
) -> tuple[list[float], float, float]:
    """(seconds per timed step, step-0 loss, peak memory GiB). Each toolkit's batches are collated by
    `prepare` before the timing, in pinned memory on CUDA, as both toolkits' DataLoaders hand them over."""
    batches = [prepare(p) for p in pairs]
    reset_memory(check)
    loss0 = step(batches[0])
    for b in batches[1:warmup]:
        step(b)
    times = [timed(check, lambda b=b: step(b))[0] for b in batches[warmup:]]
    return times, loss0, peak_memory(check)


def _seqtrain_speed(
    check: Check, arch: str, vocab: int, pairs: list[Any], warmup: int, *extra: str
) -> tuple[tuple[list[float], float, float], argparse.Namespace, dict[str, torch.Tensor], Seq2SeqFlops]:
    trainer, _ = lib.make_trainer(check.dry, arch, vocab, "bf16", *extra)
    state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}

    def step(sample: Any) -> float:
        return trainer.train_step([sample])["loss"] * math.log(2)

    return (
        _train_toolkit(check, step, pairs, warmup, lambda p: _seqtrain_batch(check, p)),
        argparse.Namespace(**trainer.run_args),
        state,
        Seq2SeqFlops.from_model(trainer.model),
    )


def _transformers_speed(
    check: Check,
    targs: argparse.Namespace,
    state: dict[str, torch.Tensor],
    vocab: int,
    pairs: list[Any],
    warmup: int,
    cudnn_attention: bool,
) -> tuple[list[float], float, float]:
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    step = _transformers_step(check, targs, state, vocab)
    return _train_toolkit(check, step, pairs, warmup, lambda p: _transformers_batch(check, p))


def _seqtrain_batch(check: Check, pairs: list[Any]) -> dict[str, Any]:
    return lib.pinned(lib.seqtrain_sample(pairs), check.device)


def _transformers_batch(check: Check, pairs: list[Any]) -> dict[str, torch.Tensor]:
    return lib.pinned(lib.hf_batch(pairs, torch.device("cpu")), check.device)


def _transformers_step(
    check: Check, targs: argparse.Namespace, state: dict[str, torch.Tensor], vocab: int
) -> Callable[[Any], float]:
    """transformers' training step on seqtrain's weights `state`, on a batch from _transformers_batch: bf16
    autocast, fused AdamW; returns the loss."""
    hf = lib.hf_model(targs, state, vocab).to(check.device).train()
    opt = torch.optim.AdamW(
        hf.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, fused=True
    )

    def step(batch: dict[str, torch.Tensor]) -> float:
        batch = {k: v.to(check.device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(check.device.type, dtype=torch.bfloat16):
            loss = hf(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def stage_train_speed(check: Check) -> dict[str, Any]:
    # (arch, sentences a step, the figures' prefix): ~16k source tokens a step as the CNN/DM presets' micro-
    # batch, and ~66k (bart_large_b64), a micro-batch that fills an 80 GB GPU, where kernel launches no
    # longer set the pace
    configs = (
        [("bart_tiny", 4, "bart_tiny")]
        if check.dry
        else [
            ("bart_base", 16, "bart_base"),
            ("bart_large", 16, "bart_large"),
            ("bart_large", 64, "bart_large_b64"),
        ]
    )
    vocab = 1000 if check.dry else lib.BART_VOCAB
    steps, warmup = (3, 1) if check.dry else (10, 3)
    src_len, tgt_len = ((40, 64), (8, 16)) if check.dry else ((900, 1024), (50, 110))
    out: dict[str, Any] = {}
    for i_config, (model_arch, bsz, arch) in enumerate(configs):
        pairs = [lib.make_pairs(bsz, src_len, tgt_len, vocab, seed=i) for i in range(steps)]
        res = {}
        # seqtrain as its CLI runs (attention off cuDNN), then with --cudnn-attention (the first arch: the
        # evidence for that default); transformers as its users get it (torch's default: cuDNN attention
        # first on Hopper) and with cuDNN off, the same kernels as seqtrain's. The speedup is taken against
        # the faster of the two.
        res["seqtrain"], targs, state, counter = _seqtrain_speed(check, model_arch, vocab, pairs, warmup)
        reset_memory(check)  # the seqtrain trainer is gone: the device is free for the other toolkit
        if i_config == 0:
            res["seqtrain_cudnn"] = _seqtrain_speed(
                check, model_arch, vocab, pairs, warmup, "--cudnn-attention"
            )[0]
            reset_memory(check)
        default_cudnn = torch.backends.cuda.cudnn_sdp_enabled()
        for name, cudnn in (("transformers", True), ("transformers_nocudnn", False)):
            res[name] = _transformers_speed(check, targs, state, vocab, pairs, warmup, cudnn)
            reset_memory(check)
        torch.backends.cuda.enable_cudnn_sdp(default_cudnn)
        timed_flops = sum(
            counter.train_flops([len(s) for s, _ in p], [len(t) for _, t in p]) for p in pairs[warmup:]
        )
        timed_tokens = sum(len(s) + len(t) for p in pairs[warmup:] for s, t in p)
        for tk, (times, loss0, mem) in res.items():
            total = sum(times)
            out[f"{arch}_{tk}_tokens_per_s"] = timed_tokens / total
            out[f"{arch}_{tk}_ms_per_step"] = 1000 * statistics.median(times)
            out[f"{arch}_{tk}_peak_mem_gib"] = mem
            out[f"{arch}_{tk}_mfu"] = timed_flops / total / check.peak
            out[f"{arch}_{tk}_step0_loss"] = loss0
        out[f"{arch}_speedup"] = out[f"{arch}_seqtrain_tokens_per_s"] / max(
            out[f"{arch}_transformers_tokens_per_s"], out[f"{arch}_transformers_nocudnn_tokens_per_s"]
        )
        loss_s, loss_t = res["seqtrain"][1], res["transformers"][1]
        out[f"{arch}_step0_loss_rel_diff"] = abs(loss_s - loss_t) / loss_s
        out[f"{arch}_tokens_per_step"] = timed_tokens / (len(pairs) - warmup)
        if out[f"{arch}_step0_loss_rel_diff"] > 1e-2:
            raise RuntimeError(f"{arch}: step-0 losses differ: {loss_s} vs {loss_t}")
    return out


def stage_fp16_resume(check: Check) -> dict[str, Any]:
    """Updates 1..n in one run; a second run saved at k, reloaded into a fresh trainer, continued to n.
    Under --deterministic (seqtrain.cuda.set_deterministic; gpu_check.sh exports CUBLAS_WORKSPACE_CONFIG before
    CUDA starts): attention backward may otherwise sum in a different order from run to run, which no resume
    could repeat, and warn_only=True would leave flash / memory-efficient attention's backward
    non-deterministic. torch's settings are put back afterwards (stage_determinism's helpers)."""
    saved = determinism_settings()
    try:
        return _fp16_resume(check)
    finally:
        restore_determinism_settings(saved)


def _fp16_resume(check: Check) -> dict[str, Any]:
    precision = "bf16" if check.dry else "fp16"
    n, k = 6, 3
    pairs = [lib.make_pairs(4, (20, 40), (6, 12), 1000, seed=100 + i) for i in range(n)]

    def run(updates: list[int], trainer: Trainer) -> None:
        for i in updates:
            trainer.train_step([lib.seqtrain_sample(pairs[i])])

    extra = ("--fp16-init-scale", "128", "--fp16-scale-window", "2") if precision == "fp16" else ()
    extra = (*extra, "--deterministic")
    whole, _ = lib.make_trainer(check.dry, "bart_tiny", 1000, precision, "--dropout", "0.1", *extra)
    run(list(range(n)), whole)
    first, _ = lib.make_trainer(check.dry, "bart_tiny", 1000, precision, "--dropout", "0.1", *extra)
    run(list(range(k)), first)
    path = os.path.join(check.out, "resume-checkpoint.pt")
    torch.save(first.state_dict({}), path)
    second, _ = lib.make_trainer(check.dry, "bart_tiny", 1000, precision, "--dropout", "0.1", *extra)
    second.load_state_dict(torch.load(path, map_location="cpu", weights_only=False), path)
    os.remove(path)
    run(list(range(k, n)), second)
    diffs = [
        float((a - b).detach().abs().max())
        for a, b in zip(whole.model.parameters(), second.model.parameters(), strict=True)
    ]

    def scale(t: Trainer) -> float | None:
        return t.scaler.loss_scale if t.scaler is not None else None

    out = {
        "precision": precision,
        "updates": n,
        "resumed_at": k,
        "max_param_diff": max(diffs),
        "bitwise_equal": max(diffs) == 0.0,
        "loss_scale_whole": scale(whole),
        "loss_scale_resumed": scale(second),
        "num_updates": second.get_num_updates(),
    }
    if (
        out["loss_scale_whole"] != out["loss_scale_resumed"]
        or second.get_num_updates() != whole.get_num_updates()
    ):
        raise RuntimeError(f"resume differs: {out}")
    if not out["bitwise_equal"]:
        raise RuntimeError(f"resumed parameters differ by up to {max(diffs):g}")
    return out


def stage_oom(check: Check) -> dict[str, Any]:
    """An update whose batch does not fit is split and kept (meter oom_split), under a memory cap a few GiB above
    what the trainer holds; the next update trains; the cap is lifted after."""
    if check.device.type != "cuda":
        return {"skip_reason": "needs CUDA (the trainer adapts only to a CUDA out-of-memory error)"}
    trainer, _ = lib.make_trainer(check.dry, "bart_base", lib.BART_VOCAB, "bf16")
    small = lib.make_pairs(4, (100, 200), (20, 40), lib.BART_VOCAB, seed=7)
    assert trainer.train_step([lib.seqtrain_sample(small)]) is not None
    base = torch.cuda.memory_allocated(check.device)
    # torch 2.11's set_per_process_memory_fraction wants a device index, not a bare "cuda"
    index = torch.cuda.current_device() if check.device.index is None else check.device.index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, (base + 4 * 2**30) / total), index)
    try:
        big = lib.make_pairs(
            256, (900, 1024), (100, 140), lib.BART_VOCAB, seed=8
        )  # ~250k tokens: beyond 4 GiB
        start = time.perf_counter()
        kept = trainer.train_step([lib.seqtrain_sample(big)])
        seconds = time.perf_counter() - start
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    after = torch.cuda.memory_allocated(check.device)
    stats = trainer.train_step([lib.seqtrain_sample(small)])
    meters = trainer.meters["train"]
    out = {
        "oom_update_kept": kept is not None,
        "oom_splits": meters["oom_split"].sum if "oom_split" in meters else 0,
        "oom_update_s": seconds,
        "allocated_gib_before": base / 2**30,
        "allocated_gib_after_recovery": after / 2**30,
        "next_update_loss": stats["loss"] if stats else None,
    }
    if kept is None or not out["oom_splits"] or stats is None or not math.isfinite(stats["loss"]):
        raise RuntimeError(f"no split and recovery: {out}")
    return out


def _generate_setup(check: Check, n: int) -> tuple[Any, Any, Any, Dictionary, list[list[int]]]:
    """The generate stages' settings, model pair (transformers', seqtrain's; same random weights), dictionary
    and `n` CNN/DM-like sources."""
    import bench_generate as bg

    vocab = 1000 if check.dry else lib.BART_VOCAB
    src_len = (20, 30) if check.dry else (400, 700)
    s = bg.Settings(beam=4, lenpen=2.0, no_repeat_ngram_size=3, min_len=5, max_len_b=10 if check.dry else 60)
    shape = "small" if check.dry else "base"
    hf, ours = bg.load_pair(bg.peaked_random_state(vocab, seed=0, eos_scale=4.0, shape=shape), vocab, shape)
    hf, ours = hf.to(check.device), ours.to(check.device)
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    sources = [s_.tolist() for s_, _ in lib.make_pairs(n, src_len, (2, 3), vocab, seed=11)]
    return s, hf, ours, d, sources


def _ours_decoder(
    check: Check, ours: Any, d: Dictionary, s: Any, static: bool = False
) -> tuple[Callable[[list[list[int]]], list[list[int]]], Any]:
    """A best-hypothesis decoder on seqtrain's generator (one generator, so the static path keeps its buffers
    and graphs across batches), and the generator."""
    import bench_generate as bg

    gen = bg.make_generator(ours, d, s, static_decoding=static)

    def decode(batch: list[list[int]]) -> list[list[int]]:
        return [
            h[0]["tokens"].tolist() for h in gen.generate(bg.pad_batch(batch, left=True).to(check.device))
        ]

    return decode, gen


def _hf_decoder(
    check: Check, hf: Any, s: Any, width: int | None = None, **generate_kwargs: Any
) -> Callable[[list[list[int]]], list[list[int]]]:
    """The same search with transformers' generate (fairseq's forced EOS at the max length); `width`: the
    sources padded on the right to that many tokens (one shape for a compiled forward); `generate_kwargs`:
    more of generate's arguments (cache_implementation="static", ...)."""
    import bench_generate as bg

    def decode(batch: list[list[int]]) -> list[list[int]]:
        import transformers

        src = bg.pad_batch(batch, left=False)
        if width is not None:
            src = torch.nn.functional.pad(src, (0, width - src.size(1)), value=lib.PAD)
        src = src.to(check.device)
        max_length = s.max_len_b + 2
        gen = hf.generate(
            input_ids=src,
            attention_mask=src.ne(lib.PAD),
            num_beams=s.beam,
            length_penalty=s.lenpen,
            early_stopping=True,
            no_repeat_ngram_size=s.no_repeat_ngram_size,
            min_length=s.min_len + 1,
            max_length=max_length,
            decoder_start_token_id=lib.EOS,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            suppress_tokens=[lib.PAD],
            logits_processor=transformers.LogitsProcessorList([bg.fairseq_forced_eos(max_length)]),
            do_sample=False,
            num_return_sequences=1,
            **generate_kwargs,
        )
        rows = [r[1:] for r in gen.tolist()]
        return [r[: r.index(lib.EOS) + 1] if lib.EOS in r else r for r in rows]

    return decode


def stage_generate(check: Check) -> dict[str, Any]:
    n, bsz = (4, 2) if check.dry else (256, 32)
    s, hf, ours, d, sources = _generate_setup(check, n)
    batches = [sources[i : i + bsz] for i in range(0, n, bsz)]
    ours_decode, _ = _ours_decoder(check, ours, d, s)
    hf_decode = _hf_decoder(check, hf, s)

    out: dict[str, Any] = {"sentences": n, "batch_size": bsz, "beam": s.beam}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here: the hypotheses must be identical
    default_cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    # fp32; bf16 under autocast (fp32 weights); bf16 weights without autocast, as `seqtrain-generate --bf16` and
    # transformers' torch_dtype=torch.bfloat16 run (last: the models are converted in place)
    for precision, dtype, amp_on in (
        ("fp32", None, False),
        ("bf16", torch.bfloat16, True),
        ("bf16_weights", torch.bfloat16, False),
    ):
        if precision == "bf16_weights":
            hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
        hyps: dict[str, list[list[int]]] = {}
        # seqtrain as seqtrain-generate runs it (attention off cuDNN); transformers with torch's default
        # (cuDNN attention first on Hopper, for half precision), and in bf16 also with cuDNN off
        runs = [("seqtrain", ours_decode, False), ("transformers", hf_decode, True)]
        if dtype is not None:
            runs.append(("transformers_nocudnn", hf_decode, False))
        for name, fn, cudnn in runs:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            amp = torch.autocast(check.device.type, dtype=dtype, enabled=amp_on)
            with torch.inference_mode(), amp:
                fn(batches[0][:2])  # warm-up
                seconds, got = timed(check, lambda fn=fn: [h for b in batches for h in fn(b)])
            hyps[name] = got
            out[f"{precision}_{name}_sentences_per_s"] = n / seconds
        out[f"{precision}_speedup"] = out[f"{precision}_seqtrain_sentences_per_s"] / max(
            out[f"{precision}_{name}_sentences_per_s"] for name, _, _ in runs if name != "seqtrain"
        )
        out[f"{precision}_identical"] = sum(
            a == b for a, b in zip(hyps["seqtrain"], hyps["transformers"], strict=True)
        )
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cuda.enable_cudnn_sdp(default_cudnn)
    if out["fp32_identical"] < n:
        raise RuntimeError(f"fp32 best hypotheses differ: {out['fp32_identical']}/{n} identical")
    return out


def stage_generate_static(check: Check) -> dict[str, Any]:
    """The static decoding path (CUDA graphs, finished on the device; issue 27) against the eager loop and
    transformers: fp32 best hypotheses identical to transformers' and the eager loop's on `n_fp32` sentences,
    and fp32 sentences/s of the graphed path and transformers' generate on them (alternating, after the
    identity pass that captures); in bf16 weights (seqtrain-generate --bf16) sentences/s of the eager loop,
    the graphed path (its first pass, which captures, timed apart) and transformers' generate, the capture
    seconds, and the agreement of the graphed path's best hypotheses with the eager loop's (bf16 may differ by
    rounding)."""
    n, bsz, n_fp32 = (2, 2, 2) if check.dry else (128, 32, 64)  # dry: bf16 on a CPU is slow
    fp32_reps = 2 if check.dry else 4  # timed fp32 passes of each engine
    s, hf, ours, d, sources = _generate_setup(check, n)
    batches = [sources[i : i + bsz] for i in range(0, n, bsz)]
    fp32_batches = [sources[i : i + bsz] for i in range(0, n_fp32, bsz)]
    hf_decode = _hf_decoder(check, hf, s)
    eager_decode, _ = _ours_decoder(check, ours, d, s)
    out: dict[str, Any] = {"sentences": n, "batch_size": bsz, "beam": s.beam, "fp32_sentences": n_fp32}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the hypotheses must be identical
    try:
        with torch.no_grad():
            static_decode, _ = _ours_decoder(check, ours, d, s, static=True)
            got = {name: [h for b in fp32_batches for h in fn(b)] for name, fn in
                   (("static", static_decode), ("eager", eager_decode), ("transformers", hf_decode))}  # fmt: skip
            out["fp32_identical_transformers"] = sum(
                a == b for a, b in zip(got["static"], got["transformers"])
            )
            out["fp32_identical_eager"] = sum(a == b for a, b in zip(got["static"], got["eager"]))
            # fp32 speed on those sentences (the pass above captured the static path's graphs and warmed
            # transformers up): the engines alternate, each first in turn, so neither gets the warmer device
            times = {"static": 0.0, "transformers": 0.0}
            engines = (("static", static_decode), ("transformers", hf_decode))
            for r in range(fp32_reps):
                for name, fn in engines if r % 2 == 0 else engines[::-1]:
                    times[name] += timed(check, lambda fn=fn: [h for b in fp32_batches for h in fn(b)])[0]
            for name, seconds in times.items():
                out[f"fp32_{name}_sentences_per_s"] = fp32_reps * n_fp32 / seconds

            hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
            static_decode, static_gen = _ours_decoder(check, ours, d, s, static=True)
            eager_decode(batches[0][:2])  # warm-up
            hf_decode(batches[0][:2])
            seconds, eager = timed(check, lambda: [h for b in batches for h in eager_decode(b)])
            out["bf16_eager_sentences_per_s"] = n / seconds
            first, _ = timed(check, lambda: [h for b in batches for h in static_decode(b)])  # captures
            seconds, static = timed(check, lambda: [h for b in batches for h in static_decode(b)])
            out["bf16_static_first_pass_s"] = first
            out["bf16_static_sentences_per_s"] = n / seconds
            decoder = static_gen._static_steps.decoder
            out["graphs"] = len(decoder.cuda_graphs)
            out["capture_s"] = decoder.capture_seconds
            out["bf16_static_agree_eager"] = sum(a == b for a, b in zip(static, eager))
            seconds, _ = timed(check, lambda: [h for b in batches for h in hf_decode(b)])
            out["bf16_transformers_sentences_per_s"] = n / seconds
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    out["fp32_static_vs_transformers"] = (
        out["fp32_static_sentences_per_s"] / out["fp32_transformers_sentences_per_s"]
    )
    out["bf16_static_vs_eager"] = out["bf16_static_sentences_per_s"] / out["bf16_eager_sentences_per_s"]
    out["bf16_static_vs_transformers"] = (
        out["bf16_static_sentences_per_s"] / out["bf16_transformers_sentences_per_s"]
    )
    if out["fp32_identical_eager"] < n_fp32 or out["fp32_identical_transformers"] < n_fp32:
        raise RuntimeError(
            f"fp32 static best hypotheses differ: {out['fp32_identical_eager']}/{n_fp32} as the eager loop's, "
            f"{out['fp32_identical_transformers']}/{n_fp32} as transformers'"
        )
    if not check.dry and out["graphs"] == 0:
        raise RuntimeError("the static path captured no CUDA graph")
    return out


def stage_generate_packed(check: Check) -> dict[str, Any]:
    """Generation's encoder pass packed (--packed-encoder; issue 27 item 5) against padded, bf16 weights, on
    unsorted CNN/DM-like sources (lengths 400-700: about a fifth of the positions are pads): the encoder
    pass alone (ms per batch, both ways, alternating), whether the default packs there, the packed output's
    largest difference from the padded one, and the best hypotheses of eager beam search both ways (bf16 may
    differ by rounding; fp32, where packing runs the dispatcher's per-sentence reference, must be identical)."""
    import bench_generate as bg

    from seqtrain.generation.sequence_generator import encode

    n, bsz, reps = (4, 2, 2) if check.dry else (128, 32, 5)
    s, _, ours, d, sources = _generate_setup(check, n)
    batches = [bg.pad_batch(sources[i : i + bsz], left=True).to(check.device) for i in range(0, n, bsz)]
    pads = sum(int(b.eq(lib.PAD).sum()) for b in batches) / sum(b.numel() for b in batches)
    out: dict[str, Any] = {"sentences": n, "batch_size": bsz, "pad_share": pads}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            small = [sources[i : i + 4] for i in range(0, min(n, 16), 4)]
            hyps = {}
            for packed in (True, False):
                decode, gen = _ours_decoder(check, ours, d, s)
                gen.packed_encoder = packed
                hyps[packed] = [h for b in small for h in decode(b)]
            out["fp32_identical"] = sum(a == b for a, b in zip(hyps[True], hyps[False]))
            out["fp32_sentences"] = len(hyps[True])
            ours = ours.to(torch.bfloat16)
            out["bf16_default_packs"] = bool(ours.encoder.packs_by_default(batches[0].eq(lib.PAD)))
            diff = 0.0
            for b in batches:
                real = b.ne(lib.PAD)
                a_, b_ = (encode(ours, b, None, p)["encoder_out"][real].float() for p in (True, False))
                diff = max(diff, float((a_ - b_).abs().max()))
            out["bf16_encoder_max_abs_diff"] = diff
            times: dict[bool, float] = {True: 0.0, False: 0.0}
            for r in range(reps):
                for packed in (True, False) if r % 2 else (False, True):
                    seconds, _ = timed(check, lambda p=packed: [encode(ours, b, None, p) for b in batches])
                    times[packed] += seconds
            for packed, name in ((True, "packed"), (False, "padded")):
                out[f"bf16_encoder_{name}_ms_per_batch"] = 1e3 * times[packed] / (reps * len(batches))
            out["bf16_encoder_packed_speedup"] = times[False] / times[True]
            hyps = {}
            for packed in (True, False):
                decode, gen = _ours_decoder(check, ours, d, s)
                gen.packed_encoder = packed
                seconds, hyps[packed] = timed(check, lambda f=decode: [h for b in small for h in f(b)])
                out[f"bf16_{'packed' if packed else 'padded'}_generate_s"] = seconds
            out["bf16_agree"] = sum(a == b for a, b in zip(hyps[True], hyps[False]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    if out["fp32_identical"] < out["fp32_sentences"]:
        raise RuntimeError(
            f"fp32 best hypotheses differ packed / padded: {out['fp32_identical']}/{out['fp32_sentences']}"
        )
    if not check.dry and not out["bf16_default_packs"]:
        raise RuntimeError("the encoder does not pack by default in bf16 on CUDA (no varlen kernel?)")
    return out


def _compile_run(check: Check, arch: str, vocab: int, pairs: list[Any], backend: str | None) -> list[float]:
    """Seconds of the timed steps (all but the first) of a trainer, its model compiled with `backend` (what
    --compile does) or eager (None)."""
    trainer, _ = lib.make_trainer(check.dry, arch, vocab, "bf16")
    if backend is not None:
        trainer._forward_model = torch.compile(trainer._forward_model, backend=backend)
    samples = [_seqtrain_batch(check, p) for p in pairs]
    trainer.train_step([samples[0]])
    return [timed(check, lambda s=s: trainer.train_step([s]))[0] for s in samples[1:]]


def stage_compile(check: Check) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    arch = "bart_tiny" if check.dry else "bart_base"
    vocab = 1000 if check.dry else lib.BART_VOCAB
    steps = 4 if check.dry else 8
    # one shape for every step: the figure is the graph breaks of the step, not recompilations for new shapes
    src_len, tgt_len = ((48, 48), (12, 12)) if check.dry else ((1000, 1000), (80, 80))
    pairs = [
        lib.make_pairs(4 if check.dry else 16, src_len, tgt_len, vocab, seed=50 + i) for i in range(steps)
    ]
    backend = "eager" if check.dry else "inductor"  # dynamo's own backend in a dry run: no C++ build
    out: dict[str, Any] = {"arch": arch, "backend": backend}
    out["eager_ms_per_step"] = 1000 * statistics.median(_compile_run(check, arch, vocab, pairs, None))
    torch._dynamo.reset()
    counters.clear()
    out["compiled_ms_per_step"] = 1000 * statistics.median(_compile_run(check, arch, vocab, pairs, backend))
    out["graph_breaks"] = sum(counters["graph_break"].values())
    out["graph_break_reasons"] = sorted({r.splitlines()[0][:160] for r in counters["graph_break"]})[:10]
    out["unique_graphs"] = counters["stats"].get("unique_graphs", 0)
    return out


def stage_profile(check: Check) -> dict[str, Any]:
    """Where a training step's time goes: torch.profiler over 3 steps of seqtrain and of transformers (the
    first arch of train_speed, cuDNN attention off for both), the top operators by device time written to
    $OUT/profile_<toolkit>.txt; the figures are wall time per step against the device's busy time (kernel
    time summed), so a step waiting on the host shows as a gap."""
    from torch.profiler import ProfilerActivity, profile

    arch = "bart_tiny" if check.dry else "bart_large"
    vocab = 1000 if check.dry else lib.BART_VOCAB
    bsz, src_len, tgt_len = (4, (40, 64), (8, 16)) if check.dry else (16, (900, 1024), (50, 110))
    pairs = [lib.make_pairs(bsz, src_len, tgt_len, vocab, seed=200 + i) for i in range(5)]
    trainer, _ = lib.make_trainer(check.dry, arch, vocab, "bf16")
    state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
    steps = {
        "seqtrain": (lambda s: trainer.train_step([s]), _seqtrain_batch),
        "transformers": (
            _transformers_step(check, argparse.Namespace(**trainer.run_args), state, vocab),
            _transformers_batch,
        ),
    }
    torch.backends.cuda.enable_cudnn_sdp(False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if check.device.type == "cuda" else [])
    out: dict[str, Any] = {"arch": arch}
    for name, (step, prepare) in steps.items():
        batches = [prepare(check, p) for p in pairs]
        for b in batches[:2]:
            step(b)  # warm-up
        check.sync()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for b in batches[2:]:
                step(b)
            check.sync()
            wall = (time.perf_counter() - start) / 3
        key = "self_device_time_total" if check.device.type == "cuda" else "self_cpu_time_total"
        events = prof.key_averages()
        kernels = lib.device_kernels(events)
        with open(os.path.join(check.out, f"profile_{name}.txt"), "w", encoding="utf-8") as f:
            f.write(events.table(sort_by=key, row_limit=40, max_name_column_width=60))
        # The host's side: operators and CUDA runtime calls by self CPU time (a step that waits on the device
        # shows the wait in its synchronising call, e.g. cudaStreamSynchronize or aten::_local_scalar_dense)
        host = sorted(
            (e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
            key=lambda e: e.self_cpu_time_total,
            reverse=True,
        )
        with open(os.path.join(check.out, f"profile_{name}_host.txt"), "w", encoding="utf-8") as f:
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=60))
        out[f"{name}_host_top"] = [
            f"{e.key}: {e.self_cpu_time_total / 1e3 / 3:.1f} ms/step, {e.count / 3:.0f} calls"
            for e in host[:8]
        ]
        out[f"{name}_ms_per_step"] = 1000 * wall
        if kernels:  # the device's busy time: every kernel's time, summed
            out[f"{name}_device_busy_ms_per_step"] = sum(e.self_device_time_total for e in kernels) / 1e3 / 3
            out[f"{name}_kernels_per_step"] = sum(e.count for e in kernels) / 3
    return out


STAGES: list[tuple[str, Callable[[Check], dict[str, Any]]]] = [
    ("env", stage_env),
    ("cuda_tests", stage_cuda_tests),
    ("numerics", stage_numerics),
    ("sync_count", stage_sync_count),
    ("train_speed", stage_train_speed),
    ("fp16_resume", stage_fp16_resume),
    ("oom", stage_oom),
    ("generate", stage_generate),
    ("generate_static", stage_generate_static),
    ("generate_packed", stage_generate_packed),
    ("compile", stage_compile),
    ("profile", stage_profile),
]


def table(results: dict[str, Any]) -> str:
    """The figures as a markdown table, targets beside the figures they judge."""
    lines = ["| stage | status | s | figures |", "|---|---|---|---|"]
    for name, res in results["stages"].items():
        figs = []
        for k, v in res.items():
            if k in ("status", "seconds"):
                continue
            text = f"{v:.4g}" if isinstance(v, float) else str(v)
            target = {
                "bart_large_seqtrain_mfu": "mfu_bart_large",
                "bart_large_speedup": "train_speedup_bart_large",
                "bart_large_b64_seqtrain_mfu": "mfu_bart_large",
                "bart_large_b64_speedup": "train_speedup_bart_large",
                "bf16_speedup": "generate_speedup",
                "bf16_weights_speedup": "generate_speedup",
            }.get(k)
            if target:
                text += f" (target >= {TARGETS[target]:g})"
            figs.append(f"{k}={text}")
        lines.append(f"| {name} | {res['status']} | {res['seconds']:.0f} | {'; '.join(figs)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every stage on the CPU with tiny shapes")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out", help="folder for the results")
    p.add_argument("--stages", default=",".join(n for n, _ in STAGES), help="comma list of stages to run")
    p.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s for MFU")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check.py: error: no CUDA device; pass --dry-run to check the plumbing on the CPU",
            file=sys.stderr,
        )
        return 1
    wanted = args.stages.split(",")
    unknown = [w for w in wanted if w not in dict(STAGES)]
    if unknown:
        print(f"gpu_check.py: error: --stages: unknown {', '.join(unknown)}", file=sys.stderr)
        return 2
    check = Check(args)
    failed = []
    for name, fn in STAGES:
        if name not in wanted:
            continue
        print(f"==== [{time.strftime('%H:%M:%S')}] {name}", flush=True)
        start = time.perf_counter()
        try:
            res = fn(check)
            status = "skipped" if "skip_reason" in res else "ok"
        except Exception as e:  # a failed stage is reported and the next one runs
            res, status = {"error": f"{type(e).__name__}: {e}"[:2000]}, "failed"
            failed.append(name)
        res = {"status": status, "seconds": time.perf_counter() - start, **res}
        check.results["stages"][name] = res
        print(json.dumps(res, default=float), flush=True)
        check.save()
        reset_memory(check)
    md = table(check.results)
    with open(os.path.join(check.out, "gpu_check.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    print(
        f"gpu_check.py: {'FAILED stages: ' + ', '.join(failed) if failed else 'all stages passed'}; "
        f"results in {check.out}/gpu_check.json and gpu_check.md"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
