"""int8 weights for CPU inference (`--compute-type int8`, CTranslate2's name): every projection of the encoder
and decoder layers and the output projection become dynamically quantized linears, torch's quantized engine
(fbgemm / x86 on x86 CPUs): weights int8 per output channel, activations quantized per batch at run time,
int32 accumulation, fp32 out, packed for oneDNN's int8 kernels where fp32 goes to oneDNN (cpu_products.int8_engine:
CPUs other than Intel's), else for torch's default engine. Measured on the 2-core AVX2 development CPU at
bart_small / bart_base shapes, one thread: 1.2-2x the fp32 matrix products (torch._weight_int8pack_mm,
weight-only, was 50x slower there); on a Zen 5 AVX-512 EPYC oneDNN's int8 ran 1.1-1.8x fbgemm's.

The fused projections of the attention (q, k and v of self-attention; k and v of cross-attention), which the
float model concatenates from the separate weights on the fly, are quantized fused once here. The token
embedding stays float (a lookup); the output projection, tied to it in the float model, gets its own int8 copy.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from seqtrain.models.cpu_products import int8_engine

COMPUTE_TYPES = ("default", "auto", "float32", "int8")


def int8_supported() -> bool:
    """Whether torch has a quantized engine for dynamic int8 linears on this CPU."""
    return any(
        e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm", "onednn", "qnnpack")
    )


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output channel and x quantized per call (torch.ops.quantized.linear_dynamic)."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        zero = torch.zeros(w.size(0), dtype=torch.long)
        with warnings.catch_warnings():
            # torch 2.13 marks quantized tensors deprecated (pytorch issue 184982) without a replacement for
            # the dynamic int8 linear yet; this is the one place seqtrain makes one
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor, torch.quantize_per_channel")
            q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        b = None if bias is None else bias.detach().float()
        engine = torch.backends.quantized.engine
        torch.backends.quantized.engine = int8_engine()  # the params keep the engine they were packed for
        try:
            self.packed = torch.ops.quantized.linear_prepack(q, b)
        finally:
            torch.backends.quantized.engine = engine
        self.in_features, self.out_features = w.size(1), w.size(0)

    @classmethod
    def fused(cls, *layers: nn.Linear) -> Int8Linear:
        """One int8 projection for several of the same input (their outputs side by side)."""
        bias = [m.bias for m in layers]
        return cls(
            torch.cat([m.weight for m in layers]),
            torch.cat(bias) if all(b is not None for b in bias) else None,
        )

    def forward(self, x: Tensor) -> Tensor:
        # reduce_range: 7-bit activations, as torch's dynamic quantization does, so AVX2's 16-bit
        # multiply-add pairs cannot saturate
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, x.size(-1)), self.packed, True)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_int8(model: nn.Module) -> nn.Module:
    """Swap the model's linears for Int8Linear in place (a BARTModel in eval mode on the CPU, LoRA merged);
    returns it. Parameters that only the swapped linears used are dropped from it."""
    from seqtrain.models.transformer import MultiheadAttention  # (components: models imports models)

    for module in list(model.modules()):
        if isinstance(module, MultiheadAttention):
            module.int8_qkv = Int8Linear.fused(module.q_proj, module.k_proj, module.v_proj)
            module.int8_kv = Int8Linear.fused(module.k_proj, module.v_proj)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child.weight, child.bias))
    return model
