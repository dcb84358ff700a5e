"""Matrix products for CPU inference: which library runs them, and a linear layer prepared for it.

torch runs fp32 `F.linear` through MKL. MKL picks its fastest kernels on Intel CPUs only: on AMD ones it runs
AVX2 code or slower (docs/benchmarks.md: a Zen 5 AVX-512 EPYC, one thread, ~90-100 GFLOP/s against oneDNN's
~200-240 at the beam search's shapes; a Zen 3 AVX2 EPYC, oneDNN 1.0-1.5x). oneDNN (torch's mkldnn ops) picks its
kernels by the CPU's instruction sets, and packs a weight once into the blocked layout its kernels read. So, as
CTranslate2 decides (`src/cpu/backend.cc`: MKL only on a genuine Intel CPU), generation on a CPU other than
Intel's runs its fp32 products through oneDNN with weights packed once (`LinearSpec`), and int8 products through
oneDNN's dynamic int8 linear (measured on the Zen 5: 1.1-1.8x fbgemm's, which torch's default `x86` engine
picks there). `SEQTRAIN_CPU_GEMM=mkl` or `onednn` overrides the choice.

`run_linear(spec, x, act, residual)` is act(x W^T + b) (+ residual) with the activation or the residual add
fused into oneDNN's product as a post-op; the compiled decoding step (seqtrain/generation/csrc/cpu_step.cpp)
runs the same specs through the same torch operators.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.models.transformer import ACTIVATIONS

ONEDNN, DENSE, INT8 = 0, 1, 2  # LinearSpec.kind (csrc/cpu_step.cpp's Kind)
# fused activations by BartConfig.activation_fn (csrc/cpu_step.cpp's Act); others run the eager step
ACTS = {"none": 0, "gelu": 1, "gelu_accurate": 2, "gelu_fast": 2, "relu": 3}


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...); '' where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def gemm_backend() -> str:
    """`onednn` or `dense` (torch's F.linear: MKL) for fp32 products on this CPU (see the module docstring)."""
    value = os.environ.get("SEQTRAIN_CPU_GEMM", "").strip().lower()
    if value not in ("", "mkl", "onednn"):
        raise ValueError(f"SEQTRAIN_CPU_GEMM must be mkl or onednn, got {value!r}")
    if value == "mkl" or not torch.backends.mkldnn.is_available():
        return "dense"
    if value == "onednn":
        return "onednn"
    return "dense" if cpu_vendor() == "GenuineIntel" else "onednn"


def int8_engine() -> str:
    """The quantized engine int8 weights are packed for: oneDNN where fp32 products go to oneDNN, else torch's
    default (`x86`: fbgemm on these shapes)."""
    engines = torch.backends.quantized.supported_engines
    if gemm_backend() == "onednn" and "onednn" in engines:
        return "onednn"
    return torch.backends.quantized.engine


@dataclass
class LinearSpec:
    """One projection prepared for the CPU: `kind` ONEDNN (weight packed by oneDNN), DENSE (weight as is) or INT8
    (`packed`: quantized::linear_prepack's params, the bias inside)."""

    kind: int
    weight: Tensor | None
    bias: Tensor | None
    packed: Any
    out: int

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None, backend: str, rows: int) -> LinearSpec:
        """fp32 weight (out x in) and bias for `backend` (gemm_backend); `rows`: oneDNN's packing hint (any row
        count computes the same, without repacking)."""
        weight, bias = weight.detach().contiguous(), None if bias is None else bias.detach().contiguous()
        if backend == "onednn":
            return cls(
                ONEDNN, torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias, None, weight.size(0)
            )
        return cls(DENSE, weight, bias, None, weight.size(0))

    @classmethod
    def int8(cls, packed: Any, out: int) -> LinearSpec:
        return cls(INT8, None, None, packed, out)


def bucket_rows(m: int) -> int:
    """The row count a oneDNN product runs at for m rows. oneDNN keeps a primitive (generated code, buffers) per
    shape it has seen, up to 1024 of them: a search whose rows fall one by one, batch after batch, grew a
    process by ~700 MiB. In buckets a process meets a few dozen shapes: powers of two up to 8 rows (a tiny
    product costs its weight's reading, whatever the rows), multiples of 8 up to 64, of 16 up to 256, then 8
    buckets an octave (at most 12.5% more rows). csrc/cpu_step.cpp's bucket_rows is the same rule."""
    if m <= 8:
        return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8
    if m <= 64:
        return -(-m // 8) * 8
    if m <= 256:
        return -(-m // 16) * 16
    octave = 256
    while octave * 2 < m:
        octave *= 2
    step = octave // 8
    return -(-m // step) * step


def run_linear(spec: LinearSpec, x: Tensor, act: str = "none", residual: Tensor | None = None) -> Tensor:
    """act(x W^T + b) (+ residual) for 2-D x; `act` one of ACTS. residual + y is the eager layers' own order.
    oneDNN's products run at bucket_rows(rows): the last row repeated (a dynamic int8 product's quantization
    range stays the rows' own), the extra outputs dropped."""
    m = x.size(0)
    mb = bucket_rows(m)
    if spec.kind == DENSE or mb == m or m == 0:
        return _run_linear(spec, x, act, residual)
    x = torch.cat([x, x[-1:].expand(mb - m, -1)])
    if residual is not None:
        residual = torch.cat([residual, residual.new_zeros(mb - m, residual.size(1))])
    return _run_linear(spec, x, act, residual)[:m]


def _run_linear(spec: LinearSpec, x: Tensor, act: str, residual: Tensor | None) -> Tensor:
    if spec.kind == ONEDNN:
        if residual is not None and act == "none":
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, spec.weight, spec.bias, "add")
        attr = {"none": "none", "relu": "relu"}.get(act, "gelu")
        algorithm = {"gelu": "none", "gelu_accurate": "tanh", "gelu_fast": "tanh"}.get(act, "")
        y = torch.ops.mkldnn._linear_pointwise(x, spec.weight, spec.bias, attr, [], algorithm)
    else:
        if spec.kind == INT8:
            # reduce_range: 7-bit activations, as torch's dynamic quantization (AVX2's 16-bit pairs cannot saturate)
            y = torch.ops.quantized.linear_dynamic(x, spec.packed, True)
        else:
            y = F.linear(x, spec.weight, spec.bias)
        y = y if act == "none" else ACTIVATIONS[act](y)
    return y if residual is None else residual + y
