"""Helpers of scripts/gpu/gpu_check.py: a real Trainer on an in-memory dictionary, synthetic batches in seqtrain's
and transformers' layouts, transformers' twin of a seqtrain BART, and the numerics comparisons."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.nn.functional as F

from seqtrain.checkpoint.hf import args_to_hf_config, seqtrain_state_to_hf
from seqtrain.criterions.projected_loss import projected_nll_loss
from seqtrain.data import iterators
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.pair_dataset import batch_layout
from seqtrain.flags import parsing, training
from seqtrain.models import as_built
from seqtrain.tasks.translation import TranslationTask
from seqtrain.train import loop as train_loop
from seqtrain.train.program import run_record, train_config
from seqtrain.train.trainer import Trainer

PAD, EOS = 1, 2
BART_VOCAB = 50_265


def make_trainer(
    cpu: bool, arch: str, vocab: int, precision: str | None, *extra: str
) -> tuple[Trainer, TranslationTask]:
    """A real Trainer (task, criterion, optimizer as seqtrain-train builds them), in-memory dictionary."""
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    argv = [
        "in-memory",
        "--arch",
        arch,
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--lr",
        "1e-4",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0",
        "--dropout",
        "0",
        "--max-source-positions",
        "1024",
        "--max-target-positions",
        "1024",
        "--seed",
        "1",
        *extra,
    ]
    if cpu:
        argv.append("--cpu")
    if precision:
        argv.append(f"--{precision}")
    cfg = train_config(parsing.parse_args_and_arch(training.get_training_parser(), argv))
    task = TranslationTask(cfg.task, d, d)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    trainer = train_loop.build_trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.run_args = run_record(
        cfg, as_built(cfg.model)
    )  # the record its checkpoints store, as a run gives it
    return trainer, task


def make_pairs(
    n: int, src_len: tuple[int, int], tgt_len: tuple[int, int], vocab: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random token pairs, each ending with EOS, lengths uniform in the given ranges."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        s = int(torch.randint(src_len[0], src_len[1] + 1, (), generator=g))
        t = int(torch.randint(tgt_len[0], tgt_len[1] + 1, (), generator=g))
        src = torch.cat([torch.randint(4, vocab, (s - 1,), generator=g), torch.tensor([EOS])])
        tgt = torch.cat([torch.randint(4, vocab, (t - 1,), generator=g), torch.tensor([EOS])])
        pairs.append((src, tgt))
    return pairs


def _pad(seqs: list[torch.Tensor], left: bool) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        if left:
            out[i, out.size(1) - len(s) :] = s
        else:
            out[i, : len(s)] = s
    return out


def seqtrain_sample(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """A batch as seqtrain's collater makes it (left-padded sources), with the padding layout the model uses
    and the target rows the criterion uses, both found on the CPU as the collater does (no device sync)."""
    tgts = [t for _, t in pairs]
    target = _pad(tgts, left=False)
    prev = _pad([torch.cat([t[-1:], t[:-1]]) for t in tgts], left=False)
    src = _pad([s for s, _ in pairs], left=True)
    return {
        "id": torch.arange(len(pairs)),
        "nsentences": len(pairs),
        "ntokens": sum(len(t) for t in tgts),
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.tensor([len(s) for s, _ in pairs]),
            "prev_output_tokens": prev,
            "layout": batch_layout(src, prev, PAD),
        },
        "target": target,
        "target_rows": target.ne(PAD).view(-1).nonzero().squeeze(1),
    }


def pinned(batch: Any, device: torch.device) -> Any:
    """`batch` with its tensors in pinned host memory when `device` is CUDA (what a DataLoader with
    pin_memory=True hands over), else as it is."""
    return iterators.pinned(batch) if device.type == "cuda" else batch


def hf_batch(pairs: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> dict[str, torch.Tensor]:
    src = _pad([s for s, _ in pairs], left=False)
    tgts = [t for _, t in pairs]
    labels = _pad(tgts, left=False)
    prev = _pad([torch.cat([t[-1:], t[:-1]]) for t in tgts], left=False)
    labels = labels.masked_fill(labels.eq(PAD), -100)
    batch = {
        "input_ids": src,
        "attention_mask": src.ne(PAD).long(),
        "decoder_input_ids": prev,
        "labels": labels,
    }
    return {k: v.to(device) for k, v in batch.items()}


def hf_model(targs: argparse.Namespace, state: dict[str, torch.Tensor], vocab: int, attn: str = "sdpa"):
    """transformers' BartForConditionalGeneration holding seqtrain's weights `state`, its attention
    implementation `attn` ("sdpa", "flex_attention", ...)."""
    import transformers

    config = args_to_hf_config(targs, vocab)
    config.pop("architectures", None)
    config.pop("model_type", None)
    hf = transformers.BartForConditionalGeneration(
        transformers.BartConfig(**config, attn_implementation=attn)
    )
    missing, unexpected = hf.load_state_dict(seqtrain_state_to_hf(state), strict=False)
    if unexpected or any(not k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in missing):
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf


def real_tokens(batches: list[dict[str, Any]]) -> int:
    """Non-padding source and target tokens of collated batches (host tensors: no sync)."""
    return sum(int(b["net_input"]["src_lengths"].sum()) + b["ntokens"] for b in batches)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def ffn_error(device: torch.device, dry: bool, dtype: torch.dtype) -> float:
    """seqtrain's FFN autograd function (activation recomputed in backward) against plain autograd, under
    autocast: the largest gradient difference relative to the largest gradient element."""
    from seqtrain.models.transformer import _FFN

    g = torch.Generator().manual_seed(0)
    dim, ffn = (64, 256) if dry else (1024, 4096)
    x = torch.randn(512, dim, generator=g).to(device).requires_grad_()
    w1 = (torch.randn(ffn, dim, generator=g) * dim**-0.5).to(device).requires_grad_()
    b1 = torch.zeros(ffn, device=device, requires_grad=True)
    w2 = (torch.randn(dim, ffn, generator=g) * ffn**-0.5).to(device).requires_grad_()
    b2 = torch.zeros(dim, device=device, requires_grad=True)
    params = [x, w1, b1, w2, b2]
    grads = []
    for custom in (True, False):
        with torch.autocast(device.type, dtype=dtype):
            y = (
                _FFN.apply(x, w1, b1, w2, b2, F.gelu)
                if custom
                else F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
            )
        (y.float() * 1024).sum().backward()
        grads.append([p.grad.clone() / 1024 for p in params])
        for p in params:
            p.grad = None
    return max(rel_err(a, b) for a, b in zip(grads[0], grads[1], strict=True))


def loss_errors(device: torch.device, dry: bool, dtype: torch.dtype) -> dict[str, float]:
    """The projected loss at V = 50,265 under a 2^15 loss scale against full logits with
    F.cross_entropy(label_smoothing=0.1) (same precision) and fp64."""
    scale, eps_t = 2.0**15, 0.1
    eps = eps_t * (BART_VOCAB - 1) / BART_VOCAB  # fairseq's epsilon equal to torch's 0.1
    n, dim = (64, 64) if dry else (4096, 1024)
    g = torch.Generator().manual_seed(0)
    h = (0.5 * torch.randn(n, dim, generator=g)).clamp(-2, 2).to(device).requires_grad_()
    w = (0.3 * torch.randn(BART_VOCAB, dim, generator=g) * (32 / dim) ** 0.5).to(device).requires_grad_()
    t = torch.randint(0, BART_VOCAB, (n,), generator=g).to(device)
    res = []
    for kind in ("ours", "full", "fp64"):
        hh, ww = (
            (h.detach().double().requires_grad_(), w.detach().double().requires_grad_())
            if kind == "fp64"
            else (h, w)
        )
        hh.grad = ww.grad = None
        if kind == "fp64":
            loss = F.cross_entropy(F.linear(hh, ww), t, label_smoothing=eps_t, reduction="sum")
            loss.backward()
        else:
            with torch.autocast(device.type, dtype=dtype):
                if kind == "ours":
                    loss = projected_nll_loss(hh, ww, t, eps, grad_scale=scale)[0]
                else:
                    logits = F.linear(hh, ww)
            if kind == "full":
                loss = F.cross_entropy(logits.float(), t, label_smoothing=eps_t, reduction="sum")
            (loss * scale).backward()
            hh.grad /= scale
            ww.grad /= scale
        res.append((loss.detach(), hh.grad.clone(), ww.grad.clone()))
    (lo, gho, gwo), (lf, ghf, gwf), (l64, gh64, gw64) = res
    return {
        "loss_rel_err_vs_full": rel_err(lo, lf),
        "grad_h_rel_err_vs_full": rel_err(gho, ghf),
        "grad_w_rel_err_vs_full": rel_err(gwo, gwf),
        "loss_rel_err_vs_fp64": rel_err(lo, l64),
        "grad_h_rel_err_vs_fp64": rel_err(gho, gh64),
        "grad_w_rel_err_vs_fp64": rel_err(gwo, gw64),
        "grad_finite": bool(torch.isfinite(gwo).all() and torch.isfinite(gho).all()),
        # full logits through plain autograd: fp16 products rounded to fp16, so a weight-gradient column sum
        # over many rows can overflow under the scale (then only the fp64 comparison judges)
        "full_grad_finite": bool(torch.isfinite(gwf).all() and torch.isfinite(ghf).all()),
    }


def device_kernels(events: Any) -> list[Any]:
    """The device kernels of a profiler's key_averages(): CUDA events that are not the GPU ranges of
    record_function annotations (which span kernels)."""
    return [
        e
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith(("forward", "backward", "train_step-", "Optimizer.", "ProfilerStep"))
    ]


def profile_steps(device: torch.device, steps: list[Any], path: str, top: int = 8) -> dict[str, Any]:
    """torch.profiler over `steps` (callables, one per training step): wall ms per step against the device's
    busy ms per step (every kernel's time summed: a step waiting on the host shows as the gap), kernels per
    step and the `top` kernels by device time; the whole table goes to `path`. On a CPU the top entries are
    operators by self CPU time and there is no device figure."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    n = len(steps)
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for step in steps:
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = (time.perf_counter() - start) / n
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    with open(path, "w", encoding="utf-8") as f:
        f.write(events.table(sort_by=key, row_limit=40, max_name_column_width=80))
    out: dict[str, Any] = {"wall_ms": 1000 * wall}
    if cuda:
        kernels = sorted(device_kernels(events), key=lambda e: e.self_device_time_total, reverse=True)
        out["device_busy_ms"] = sum(e.self_device_time_total for e in kernels) / 1e3 / n
        out["kernels_per_step"] = sum(e.count for e in kernels) / n
        ranked = [(e.key, e.self_device_time_total) for e in kernels[:top]]
    else:
        cpu_ops = sorted(
            (e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
            key=lambda e: e.self_cpu_time_total,
            reverse=True,
        )
        ranked = [(e.key, e.self_cpu_time_total) for e in cpu_ops[:top]]
    out["top"] = [f"{name[:100]}: {us / 1e3 / n:.2f} ms/step" for name, us in ranked]
    return out
