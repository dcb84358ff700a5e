"""FLOPs of a BART (encoder-decoder transformer) training step and the peak FLOP/s of known GPUs: the
logged `mfu`.

The count is the matrix products' work on the non-padding tokens of each pair (S source tokens, T target
tokens), 2 FLOPs per multiply-add, with d/f the encoder's model/FFN width, d'/f' the decoder's, V the output
vocabulary:

    encoder layer            8 S d^2 + 4 S^2 d + 4 S d f    (q, k, v, out projections; scores, mix; FFN)
    decoder self-attention   8 T d'^2 + 4 T^2 d'
    decoder cross-attention  4 T d'^2 + 4 S d d' + 4 S T d'  (q and out on T; k and v of the source on S)
    decoder FFN              4 T d' f'
    output projection        2 T d' V
    training step            3 x forward (the backward pass does twice the forward's matrix products)

Attention is counted over the whole T x T square (causal masking skips about half of the decoder's
self-attention scores on kernels that exploit it): the convention of PaLM's MFU and of
torch.utils.flop_counter. Layer norms, softmax, activations, dropout and the optimizer are not counted; they
are memory-bound and small. For summarization, where sources are ~13x longer than targets, counting
6 x parameters x target tokens (the old figure) undercounts 4-6x; this counts every source token through the
encoder and the cross-attention.

MFU = counted FLOPs per second / the device's peak FLOP/s for the run's precision: `--peak-flops`, else the
table below picked by the CUDA device's name (dense tensor-core figures from NVIDIA's data sheets; bf16/fp16
for --bf16/--fp16, tf32 for fp32 runs that allow TF32 matrix products, fp32 otherwise). No figure is assumed
for CPUs or unknown GPUs: pass --peak-flops there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

# Dense (no sparsity) peak FLOP/s per GPU, by precision; matched against torch.cuda.get_device_name().
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},  # SXM (HBM3)
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},  # SXM
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of the GPU named `device_name` (e.g. "NVIDIA H100 80GB HBM3") for `precision` (bf16, fp16,
    tf32, fp32); None for a device the table does not know. The most specific entry wins (H100 PCIe before
    H100)."""
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        words = key.split()
        if all(w.lower() in device_name.lower() for w in words):
            return PEAK_FLOPS[key].get(precision)
    return None


def run_precision(amp_dtype: torch.dtype | None) -> str:
    """bf16 / fp16 under autocast, else tf32 when fp32 matrix products may use TF32, else fp32."""
    if amp_dtype == torch.bfloat16:
        return "bf16"
    if amp_dtype == torch.float16:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def device_peak_flops(
    device: torch.device, amp_dtype: torch.dtype | None, override: float | None = None
) -> float | None:
    """`override` (--peak-flops) if given, else the table's figure for a CUDA device; None on a CPU."""
    if override:
        return float(override)
    if device.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device), run_precision(amp_dtype))


@dataclass(frozen=True)
class Seq2SeqFlops:
    """The shapes the count needs (see the module docstring for the formula)."""

    encoder_layers: int
    decoder_layers: int
    encoder_dim: int
    decoder_dim: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    vocab: int

    @classmethod
    def from_model(cls, model: Any) -> Seq2SeqFlops | None:
        """From a seqtrain BART (or a wrapper with .module); None for a model without a BartConfig."""
        cfg = getattr(getattr(model, "module", model), "cfg", None)
        if cfg is None or not hasattr(cfg, "encoder_ffn_embed_dim"):
            return None
        return cls(
            cfg.encoder_layers,
            cfg.decoder_layers,
            cfg.encoder_embed_dim,
            cfg.decoder_embed_dim,
            cfg.encoder_ffn_embed_dim,
            cfg.decoder_ffn_embed_dim,
            cfg.tgt_vocab_size or cfg.vocab_size,
        )

    def forward_flops(self, src_lengths: Iterable[int], tgt_lengths: Iterable[int]) -> float:
        """Forward-pass FLOPs of pairs with these non-padding lengths (source i with target i)."""
        s = torch.as_tensor(
            list(src_lengths) if not torch.is_tensor(src_lengths) else src_lengths, dtype=torch.float64
        )
        t = torch.as_tensor(
            list(tgt_lengths) if not torch.is_tensor(tgt_lengths) else tgt_lengths, dtype=torch.float64
        )
        d, dd = self.encoder_dim, self.decoder_dim
        sum_s, sum_t = float(s.sum()), float(t.sum())
        sum_s2, sum_t2, sum_st = float((s * s).sum()), float((t * t).sum()), float((s * t).sum())
        encoder = self.encoder_layers * (
            8 * sum_s * d * d + 4 * sum_s2 * d + 4 * sum_s * d * self.encoder_ffn_dim
        )
        decoder = self.decoder_layers * (
            8 * sum_t * dd * dd
            + 4 * sum_t2 * dd  # self-attention
            + 4 * sum_t * dd * dd
            + 4 * sum_s * d * dd
            + 4 * sum_st * dd  # cross-attention
            + 4 * sum_t * dd * self.decoder_ffn_dim
        )
        return encoder + decoder + 2 * sum_t * dd * self.vocab

    def train_flops(self, src_lengths: Iterable[int], tgt_lengths: Iterable[int]) -> float:
        """Forward and backward: 3 x forward."""
        return 3.0 * self.forward_flops(src_lengths, tgt_lengths)

    def sample_train_flops(self, sample: dict[str, Any], padding_idx: int) -> float:
        """train_flops of a collated batch (net_input.src_lengths; non-pad target tokens per row). Call it on
        the batch while it is still on the CPU: on CUDA the counts would cost a host-device sync."""
        src, tgt = sample_lengths(sample, padding_idx)
        return self.train_flops(src, tgt)


def sample_lengths(sample: dict[str, Any], padding_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(source lengths, non-pad target lengths) of a collated batch."""
    src = sample["net_input"]["src_lengths"]
    tgt = sample["target"].ne(padding_idx).sum(dim=1)
    return src, tgt


def measured_matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """This device's matrix-product FLOP/s in `dtype`, measured: the best of `repeats` n x n x n products (for
    a CPU, whose peak no table gives; the benchmarks print useful FLOP/s against it)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b)  # warm-up: thread pools, kernel selection
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best
