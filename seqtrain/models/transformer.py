"""Transformer building blocks for BART: attention with a key/value cache, post-norm (or pre-norm) layers,
positions.

Two layouts. Packed (training, from the collater's layout): a batch's N real tokens as N x C, the sequences told
apart by `Segments` (cu_seqlens and a host max length); every layer works on the real tokens alone, and
attention is seqtrain.models.varlen's (torch's varlen flash kernel on CUDA, the exact per-segment reference
elsewhere): no mask, no pads, no scatter or gather anywhere. Padded (generation with its key/value cache, and
callers without a layout): batch-first B x T x C through `torch.nn.functional.scaled_dot_product_attention` with
boolean broadcast masks (True = may attend), never large float tensors.

Module and parameter names mirror fairseq's (`self_attn.k_proj`, `encoder_attn_layer_norm`, `fc1`, ...) so a
fairseq state dict loads without renaming; definition order follows fairseq too, so `state_dict()` lists keys in
the same order as a fairseq checkpoint.

`compile_layers(model)` (--compile) compiles each layer's packed forward as its own region (torchtitan
compiles per block): identical layers share one graph, the token count is dynamic and the max lengths are
bucketed, so a run compiles once; the criterion and the optimizer stay outside.

Why one module: attention, the layers and their two layouts share the key/value cache and mask conventions;
split apart, each piece would need the others' invariants restated.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrain.models.lora import LoRALinear
from seqtrain.models.varlen import varlen_attention

# One cache entry per attention module. Cross-attention: {"k": B x H x S x d, "v": the same}, computed once from
# the encoder output. Self-attention (decoding): {"kv": T x B x 2 x H x d}, the keys and values of every decoded
# position together, a view of the flat buffer "kv_buf"; "kv_spare" is the buffer reorder_cache gathers into,
# "qkv_weight"/"qkv_bias" the fused projection (see append_to_cache).
Cache = dict[str, Tensor]


class Segments(NamedTuple):
    """The sequences of a packed batch: `cu` (int32, B + 1 cumulative lengths, on the activations' device),
    `max_len` (a host int at least the longest; pair_dataset.batch_layout rounds it up so shapes repeat; in a
    compiled layer a length carrier instead, see `_DynamicTokens`: read it with `max_length`) and `bounds`
    (cu's values on the host, for the reference attention; None: read from cu)."""

    cu: Tensor
    max_len: int | Tensor
    bounds: Tensor | None = None


# A length carrier's one dimension is the max length plus this: never 0 or 1, which dynamo would specialize.
_CARRIER_OFFSET = 2


def max_length(segments: Segments) -> int:
    """`segments.max_len` as an int: the host int itself, or read off a length carrier's size (in a compiled
    layer a symbolic int, so a new max length reuses the graph)."""
    n = segments.max_len
    return n if isinstance(n, int) else n.size(0) - _CARRIER_OFFSET


def _time_major(buf: Tensor, t: int, b: int, h: int, d: int) -> Tensor:
    """The first t positions of a flat key/value buffer, T x B x 2 x H x d."""
    return buf[: t * b * 2 * h * d].view(t, b, 2, h, d)


def append_to_cache(cache: Cache, kv: Tensor) -> Tensor:
    """Append `kv` (B x T' x 2 x H x d: the keys and values of T' new positions) to a self-attention cache;
    returns those of every position, T x B x 2 x H x d.

    Decoding appends one position per step and beam search reorders every step, and each operator costs host
    time a GPU waits for at these sizes (a decoding step of bart_base is a few milliseconds on an H200). So keys
    and values live together in one growing time-major buffer (T x B x 2 x H x d, stored flat, capacity doubled
    when full): the append is one copy into place, straight from the fused q/k/v projection's output, instead
    of a torch.cat of the whole cache per tensor, and `reorder_cache` gathers keys and values in one
    index_select of the first T positions into a spare buffer. Attention reads strided views of it."""
    b, t_new, _, h, d = kv.shape
    old = cache.get("kv")
    t_old = 0 if old is None else old.size(0)
    need = (t_old + t_new) * b * 2 * h * d
    buf = cache.get("kv_buf")
    same_rows = old is not None and old.size(1) == b
    if (
        buf is None
        or not same_rows
        or old.data_ptr() != buf.data_ptr()  # "kv" was replaced by a tensor of its own
        or buf.numel() < need
        or buf.dtype != kv.dtype
        or buf.device != kv.device
    ):
        grown = kv.new_empty(max(need, 2 * buf.numel() if same_rows and buf is not None else 16 * need))
        if old is not None:
            _time_major(grown, t_old, b, h, d).copy_(old)
        buf = cache["kv_buf"] = grown
    full = _time_major(buf, t_old + t_new, b, h, d)
    full[t_old:].copy_(kv.transpose(0, 1))
    cache["kv"] = full
    return full


def reorder_cache(cache: Cache, new_order: Tensor) -> None:
    """In place: a self-attention cache's rows follow `new_order` (keys and values in one gather into the spare
    buffer, which then becomes the buffer)."""
    kv = cache.get("kv")
    if kv is None:
        return
    t, _, _, h, d = kv.shape
    need = t * new_order.numel() * 2 * h * d
    buf, spare = cache.get("kv_buf"), cache.get("kv_spare")
    if spare is None or spare.numel() < need or spare.dtype != kv.dtype or spare.device != kv.device:
        spare = kv.new_empty(max(need, 0 if buf is None else buf.numel()))
    out = _time_major(spare, t, new_order.numel(), h, d)
    torch.index_select(kv, 1, new_order, out=out)
    cache["kv_buf"], cache["kv"] = spare, out
    if buf is not None:
        cache["kv_spare"] = buf


def _gelu_accurate(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact erf form, as fairseq's "gelu" and transformers' "gelu"
    "gelu_accurate": _gelu_accurate,  # fairseq's name for the tanh approximation
    "gelu_fast": _gelu_accurate,
    "tanh": torch.tanh,
    "linear": lambda x: x,
    "swish": F.silu,
    "relu_squared": lambda x: F.relu(x).pow(2),
}


def make_positions(tokens: Tensor, padding_idx: int) -> Tensor:
    """fairseq's make_positions: real tokens get padding_idx+1, +2, ... counted over non-pad tokens only.

    Counting only non-pad tokens makes a left-padded row get the same positions as the same row unpadded;
    pads get padding_idx, whose embedding row is zero.
    """
    mask = tokens.ne(padding_idx).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx


class LearnedPositionalEmbedding(nn.Embedding):
    """fairseq's learned positions with the padding offset: max_positions + padding_idx + 1 rows (1026 for 1024)."""

    def __init__(self, max_positions: int, embedding_dim: int, padding_idx: int):
        super().__init__(max_positions + padding_idx + 1, embedding_dim, padding_idx)
        self.max_positions = max_positions

    def forward(self, tokens: Tensor, step: int | None = None) -> Tensor:  # type: ignore[override]
        """Positions for `tokens` (B x T); with `step` (incremental decoding) one position for every row."""
        if step is not None:
            return self.weight[self.padding_idx + step].view(1, 1, -1)
        return super().forward(make_positions(tokens, self.padding_idx))


class MultiheadAttention(nn.Module):
    """Multi-head attention with fairseq's parameter names (k_proj, v_proj, q_proj, out_proj).

    `kdim` is the width of the keys/values source (the encoder's for cross-attention).
    """

    def __init__(self, embed_dim: int, num_heads: int, kdim: int | None = None, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {num_heads} attention heads")
        kdim = kdim or embed_dim
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.k_proj = nn.Linear(kdim, embed_dim)
        self.v_proj = nn.Linear(kdim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # --compute-type int8 (models/int8.py): the fused q/k/v and k/v projections, quantized once
        self.int8_qkv: nn.Module | None = None
        self.int8_kv: nn.Module | None = None

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.embed_dim)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False) -> Tensor:
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)

    def self_attention(
        self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False, cache: Cache | None = None
    ) -> Tensor:
        """x: B x T x C. mask: bool, broadcastable to B x H x T x T. With `cache`, new keys/values are appended
        to the cached ones, and queries attend to all of them (the caller feeds one step at a time)."""
        if cache is not None:
            # Decoding: one matrix product for q, k and v of the new position (its weight concatenated once per
            # search, in the cache), as the packed path does per call. Under autocast the weight is kept in
            # autocast's dtype: autocast caches its casts of parameters, not of this concatenation, and would
            # cast it again on every step (the same values: the cast is the one autocast makes).
            if self.int8_qkv is not None:  # --compute-type int8: fused and quantized once (models/int8.py)
                qkv = self.int8_qkv(x)
            else:
                if "qkv_weight" not in cache:
                    weight, bias = _fused_params(self.q_proj, self.k_proj, self.v_proj)
                    kind = x.device.type
                    if torch.is_autocast_enabled(kind) and weight.dtype == torch.float32:
                        dtype = torch.get_autocast_dtype(kind)
                        weight, bias = weight.to(dtype), None if bias is None else bias.to(dtype)
                    cache["qkv_weight"] = weight
                    if bias is not None:
                        cache["qkv_bias"] = bias
                qkv = F.linear(x, cache["qkv_weight"], cache.get("qkv_bias"))
            b, t, _ = x.shape
            qkv = qkv.view(b, t, 3, self.num_heads, -1)
            k, v = append_to_cache(cache, qkv[:, :, 1:]).permute(2, 1, 3, 0, 4).unbind(0)  # B x H x T x d
            q = qkv[:, :, 0].transpose(1, 2)
            is_causal = False  # one new query sees every cached key
        else:
            q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        return self.out_proj(self._merge(self._sdpa(q, k, v, mask, is_causal)))

    def _varlen(
        self, q: Tensor, k: Tensor, v: Tensor, seg_q: Segments, seg_k: Segments, causal: bool
    ) -> Tensor:
        p = self.dropout if self.training else 0.0
        max_q, max_k = max_length(seg_q), max_length(seg_k)
        o = varlen_attention(q, k, v, seg_q.cu, seg_k.cu, max_q, max_k, causal, p, seg_q.bounds, seg_k.bounds)
        return self.out_proj(o.reshape(o.size(0), self.embed_dim))

    def packed_self_attention(self, x: Tensor, segments: Segments, causal: bool) -> Tensor:
        """Self-attention of packed tokens (N x C) within each of their sequences; N x C. q, k and v come
        from one matrix product (their weights concatenated)."""
        qkv = (
            self.int8_qkv(x)
            if self.int8_qkv is not None
            else _fused_linear(x, self.q_proj, self.k_proj, self.v_proj)
        )
        qkv = qkv.view(x.size(0), 3, self.num_heads, -1)
        q, k, v = qkv.unbind(1)
        return self._varlen(q, k, v, segments, segments, causal)

    def packed_cross_attention(
        self, x: Tensor, segments: Segments, memory: Tensor, memory_segments: Segments
    ) -> Tensor:
        """Attention of packed queries (N x C) to the packed memory (M x kdim) of the same sequences; N x C."""
        q = self.q_proj(x).view(x.size(0), self.num_heads, self.head_dim)
        kv = (
            self.int8_kv(memory)
            if self.int8_kv is not None
            else _fused_linear(memory, self.k_proj, self.v_proj)
        )
        kv = kv.view(memory.size(0), 2, self.num_heads, -1)
        k, v = kv.unbind(1)
        return self._varlen(q, k, v, segments, memory_segments, False)

    def cross_attention(
        self, x: Tensor, memory: Tensor | None, mask: Tensor | None, cache: Cache | None = None
    ) -> Tensor:
        """x: (B*beam) x T x C queries; memory: B x S x kdim; mask: bool B x 1 x 1 S (True = real token) or None.

        Keys/values are computed from `memory` once and kept in `cache`. When the query batch is `beam` times the
        memory batch, the beam is folded into the query-length axis (B x H x beam*T x d) so the encoder's
        keys/values are never repeated per beam.
        """
        if cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            assert memory is not None
            k, v = self._heads(self.k_proj(memory)), self._heads(self.v_proj(memory))
            if cache is not None:
                cache["k"], cache["v"] = k, v
        bq, t, _ = x.shape
        bk = k.size(0)
        if bq == bk:
            return self.out_proj(self._merge(self._sdpa(self._heads(self.q_proj(x)), k, v, mask)))
        if bq % bk:
            raise ValueError(f"decoder batch {bq} is not a multiple of the encoder batch {bk}")
        # rows of one sentence are adjacent (bq = bk * beam), so B*beam x T x C views as bk x beam*T x C
        q = self.q_proj(x).view(bk, (bq // bk) * t, self.num_heads, self.head_dim).transpose(1, 2)
        o = self._sdpa(q, k, v, mask)  # bk x h x beam*t x d
        return self.out_proj(o.transpose(1, 2).reshape(bq, t, self.embed_dim))


# The activations' derivatives as the kernels autograd itself runs for them (GeluBackward calls
# aten.gelu_backward, ReluBackward threshold_backward, ...), called directly: the FFN's backward pass then
# needs no nested autograd pass per layer, which costs host time on every step (a GPU step of BART is
# host-bound at CNN/DM batch sizes: docs/benchmarks.md). Others go through torch.autograd.grad.
_ACTIVATION_GRADS: dict[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    F.gelu: lambda g, h, a: torch.ops.aten.gelu_backward(g, h),
    _gelu_accurate: lambda g, h, a: torch.ops.aten.gelu_backward(g, h, approximate="tanh"),
    F.relu: lambda g, h, a: torch.ops.aten.threshold_backward(g, a, 0),
    F.silu: lambda g, h, a: torch.ops.aten.silu_backward(g, h),
    torch.tanh: lambda g, h, a: torch.ops.aten.tanh_backward(g, a),
}


def _is_meta_or_compiling(x: Tensor) -> bool:
    return x.is_meta or torch.compiler.is_compiling()


class _FFN(torch.autograd.Function):
    """fc2(act(fc1(x))) that keeps x and fc1's output for the backward pass but not act's output (the same size,
    FFN-wide): the backward pass recomputes the activation, an elementwise op, instead of storing it. For
    BART layers this drops about a quarter of the activation memory a training step holds (bart_base: 12 KiB of
    ~50 KiB per token and layer), at the cost of one activation per layer in the backward pass.

    Under autocast the forward pass casts x and the two weights itself, as autocast would (floating tensors but
    fp64), and keeps the casts for the backward pass, as autograd keeps a Linear's cast weight: the backward pass
    casts nothing again (three casts a layer fewer, each a kernel launch on a GPU) and holds x in the low
    precision (half the bytes). Autograd casts the gradients back to the inputs' dtypes. The arithmetic is
    autocast's own, so outputs and gradients equal plain autograd's bit for bit (tests/unit/models/test_bart.py)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        w1: Tensor,
        b1: Tensor | None,
        w2: Tensor,
        b2: Tensor | None,
        activation: Callable[[Tensor], Tensor],
    ) -> Tensor:
        kind = x.device.type
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
            x, w1, w2 = (_autocast_cast(t, dtype) for t in (x, w1, w2))
        h = F.linear(x, w1, b1)
        y = F.linear(activation(h), w2, b2)
        ctx.save_for_backward(x, h, w1, w2)
        ctx.activation = activation
        ctx.has_bias = (b1 is not None, b2 is not None)
        return y

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        x, h, w1, w2 = ctx.saved_tensors  # all in one dtype (autocast's casts kept by forward), as gy is
        derivative = _ACTIVATION_GRADS.get(ctx.activation)
        if derivative is not None:
            a = ctx.activation(h)
        else:
            with torch.enable_grad():
                hh = h.detach().requires_grad_()
                a = ctx.activation(hh)
        gy2 = gy.reshape(-1, gy.size(-1))
        a2 = a.detach().reshape(-1, a.size(-1))
        gw2 = gy2.t() @ a2
        gb2 = gy2.sum(0) if ctx.has_bias[1] else None
        ga = (gy2 @ w2).view(h.shape)
        if derivative is not None:
            gh = derivative(ga, h, a)
        else:
            (gh,) = torch.autograd.grad(a, hh, ga)
        gh2 = gh.reshape(-1, gh.size(-1))
        gw1 = gh2.t() @ x.reshape(-1, x.size(-1))
        gb1 = gh2.sum(0) if ctx.has_bias[0] else None
        gx = (gh2 @ w1).view(x.shape)
        return gx, gw1, gb1, gw2, gb2, None


def _autocast_cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """`t` as autocast casts an input of a low-precision op: floating tensors but fp64 go to `dtype`."""
    return t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t


class _FeedForward(nn.Module):
    """Mixin holding fc1/fc2 and the dropout settings shared by both layer kinds."""

    def _init_ffn(
        self,
        embed_dim: int,
        ffn_dim: int,
        dropout: float,
        activation_dropout: float,
        activation_fn: str,
        normalize_before: bool = False,
    ):
        self.normalize_before = normalize_before
        if activation_fn not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation_fn!r}; choose from {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation_fn]
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def _drop(self, x: Tensor) -> Tensor:
        # F.dropout returns x itself when not training or p = 0; not calling it spares an operator's host time
        return F.dropout(x, self.dropout, True) if self.training and self.dropout else x

    def _residual(self, x: Tensor, norm: nn.LayerNorm, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """Post-norm (BART): LN(x + drop(sublayer(x))). Pre-norm (normalize_before, mBART's layout):
        x + drop(sublayer(LN(x))), which keeps the input on the residual path untouched."""
        if self.normalize_before:
            return x + self._drop(sublayer(norm(x)))
        return norm(x + self._drop(sublayer(x)))

    def _ffn(self, x: Tensor) -> Tensor:
        if (
            (self.activation_dropout and self.training)
            or isinstance(self.fc1, LoRALinear)
            or isinstance(self.fc2, LoRALinear)
        ):
            x = self.activation(self.fc1(x))
            return self.fc2(F.dropout(x, self.activation_dropout, True) if self.training else x)
        if torch.is_grad_enabled() and not _is_meta_or_compiling(x):
            return _FFN.apply(
                x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.activation
            )
        return self.fc2(self.activation(self.fc1(x)))

    def _ffn_block(self, x: Tensor) -> Tensor:
        return self._residual(x, self.final_layer_norm, self._ffn)


class TransformerEncoderLayer(_FeedForward):
    """Encoder layer, post-norm as BART's (x = LN(x + drop(sublayer(x)))) or, with normalize_before, pre-norm."""

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        heads: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation_fn: str = "gelu",
        normalize_before: bool = False,
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self._init_ffn(embed_dim, ffn_dim, dropout, activation_dropout, activation_fn, normalize_before)

    def forward(self, x: Tensor, mask: Tensor | None, segments: Segments | None = None) -> Tensor:
        """Padded x (B x T x C, `mask` its attend mask) or, with `segments`, packed x (N x C); dispatched here
        so module hooks (FSDP's) run around both."""
        if segments is not None:
            return _packed_forward(self)(self, x, segments)
        x = self._residual(x, self.self_attn_layer_norm, lambda h: self.self_attn.self_attention(h, mask))
        return self._ffn_block(x)

    def forward_packed(self, x: Tensor, segments: Segments) -> Tensor:
        """The layer on packed tokens (N x C): the region --compile compiles."""
        x = self._residual(
            x, self.self_attn_layer_norm, lambda h: self.self_attn.packed_self_attention(h, segments, False)
        )
        return self._ffn_block(x)


class TransformerDecoderLayer(_FeedForward):
    """Decoder layer (post-norm, or pre-norm with normalize_before): causal self-attention, cross-attention to
    the encoder, feed-forward."""

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        heads: int,
        encoder_embed_dim: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation_fn: str = "gelu",
        normalize_before: bool = False,
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.encoder_attn = MultiheadAttention(
            embed_dim, heads, kdim=encoder_embed_dim, dropout=attention_dropout
        )
        self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)
        self._init_ffn(embed_dim, ffn_dim, dropout, activation_dropout, activation_fn, normalize_before)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_mask: Tensor | None,
        self_cache: Cache | None = None,
        cross_cache: Cache | None = None,
        segments: Segments | None = None,
        memory_segments: Segments | None = None,
    ) -> Tensor:
        """Padded x (B x T x C; with caches, incremental decoding) or, with `segments` and
        `memory_segments`, packed x (N x C) and packed memory (M x C); dispatched here so module hooks (FSDP's)
        run around both."""
        if segments is not None:
            assert memory is not None and memory_segments is not None
            return _packed_forward(self)(self, x, segments, memory, memory_segments)
        # Decoder inputs are right-padded, so the causal mask alone is exact for real positions, and pad
        # positions always see at least position 0 (no all-masked rows, hence no NaN).
        causal = x.size(1) > 1
        x = self._residual(
            x,
            self.self_attn_layer_norm,
            lambda h: self.self_attn.self_attention(h, is_causal=causal, cache=self_cache),
        )
        x = self._residual(
            x,
            self.encoder_attn_layer_norm,
            lambda h: self.encoder_attn.cross_attention(h, memory, memory_mask, cache=cross_cache),
        )
        return self._ffn_block(x)

    def forward_packed(
        self, x: Tensor, segments: Segments, memory: Tensor, memory_segments: Segments
    ) -> Tensor:
        """The layer on packed tokens (N x C) and packed memory (M x C): the region --compile compiles."""
        x = self._residual(
            x, self.self_attn_layer_norm, lambda h: self.self_attn.packed_self_attention(h, segments, True)
        )
        x = self._residual(
            x,
            self.encoder_attn_layer_norm,
            lambda h: self.encoder_attn.packed_cross_attention(h, segments, memory, memory_segments),
        )
        return self._ffn_block(x)


# --------------------------------------------------------------------------------------------- --compile
def compile_layers(model: nn.Module, backend: str = "inductor") -> int:
    """Mark every encoder and decoder layer of `model` to run its packed forward compiled by `backend`
    (torch.compile's default mode: no autotuning that picks kernels by timing); returns how many. The
    incremental (generation) and padded paths stay eager. One compiled function per layer class and backend:
    dynamo treats a layer's parameters as inputs, so every layer of a stack reuses one graph."""
    layers = [m for m in model.modules() if isinstance(m, (TransformerEncoderLayer, TransformerDecoderLayer))]
    for layer in layers:
        layer.compile_backend = backend
    return len(layers)


@functools.cache
def _compiled(cls: type, backend: str) -> Callable[..., Tensor]:
    return torch.compile(cls.forward_packed, backend=backend)


def _packed_forward(layer: _FeedForward) -> Callable[..., Tensor]:
    """The layer's forward_packed, compiled when compile_layers marked it; the inputs' token counts, the
    segment counts and the max lengths are dynamic from the first call, so new batch shapes reuse the graph."""
    backend = getattr(layer, "compile_backend", None)
    if backend is None or torch.compiler.is_compiling():
        return type(layer).forward_packed
    return _DynamicTokens(_compiled(type(layer), backend))


class _DynamicTokens:
    """Calls `fn(layer, *inputs)` after marking the first dimension of every tensor input (and the tensors of
    Segments) dynamic, and handing each Segments' max length over as a length carrier: a tensor with no
    elements whose dynamic size is the length (plus _CARRIER_OFFSET). The attention kernel takes the max
    lengths as ints; a host int in a compiled region is a constant that dynamo guards on and makes dynamic only
    when it first changes, a recompile of each layer class (2 frames and 6.4 s on the H200, 2026-12-04, at a
    new source max length; on the CPU the failing guards read `segments.max_len == 64` in the encoder layer and
    `memory_segments.max_len == 64` in the decoder's). Read off a dynamic size it is a symbolic int from the
    first compile on."""

    def __init__(self, fn: Callable[..., Tensor]):
        self.fn = fn

    def __call__(self, layer: nn.Module, *inputs: Any) -> Tensor:
        return self.fn(layer, *(_dynamic(item) for item in inputs))


def _dynamic(item: Any) -> Any:
    if isinstance(item, Segments):
        n = item.max_len
        if isinstance(n, int):
            n = torch.empty(n + _CARRIER_OFFSET, 0)  # no storage: only its size is read
        item = Segments(*(_dynamic(t) for t in (item.cu, n, item.bounds)))
    elif torch.is_tensor(item):
        torch._dynamo.mark_dynamic(item, 0)
    return item


def init_bert_params(module: nn.Module) -> None:
    """fairseq's init_bert_params: N(0, 0.02) for linear and embedding weights, zero biases and padding rows."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()


def init_xavier_params(model: nn.Module) -> None:
    """fairseq's `transformer` initialization, for models trained from scratch: xavier-uniform linear weights
    (q/k/v projections with gain 1/sqrt(2), as fairseq's MultiheadAttention), zero biases, embeddings
    N(0, dim^-0.5) with zero padding rows. BART's N(0, 0.02) suits its 768/1024-wide layers and pretrained
    starts; for narrow models trained from scratch it leaves attention nearly uniform and the tied output
    embeddings tiny, and learning to use the source stalls (see README, quality run)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if name.endswith("output_projection"):
                continue  # tied to the embeddings, initialized below
            gain = 1 / math.sqrt(2) if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj") else 1.0
            nn.init.xavier_uniform_(module.weight, gain=gain)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-0.5)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()


INITS = {"bert": lambda model: model.apply(init_bert_params), "xavier": init_xavier_params}


def embed_scale(dim: int, no_scale_embedding: bool) -> float:
    return 1.0 if no_scale_embedding else math.sqrt(dim)


def _fused_params(*layers: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """The weight and bias of several projections of the same input, stacked into one projection's (a LoRA
    projection's weight with its adapter folded in: seqtrain.models.lora)."""
    weight = torch.cat([m.effective_weight() if isinstance(m, LoRALinear) else m.weight for m in layers])
    bias = torch.cat([m.bias for m in layers]) if all(m.bias is not None for m in layers) else None
    return weight, bias


def _fused_linear(x: Tensor, *layers: nn.Linear) -> Tensor:
    """Several projections of the same input as one matrix product (one pass over x, one larger GEMM); LoRA
    projections add their adapter term (with its dropout) to their share of the output."""
    if not any(isinstance(m, LoRALinear) for m in layers):
        return F.linear(x, *_fused_params(*layers))
    weight = torch.cat([m.weight for m in layers])
    bias = torch.cat([m.bias for m in layers]) if all(m.bias is not None for m in layers) else None
    out = F.linear(x, weight, bias)
    terms = [
        m.lora_term(x) if isinstance(m, LoRALinear) else out.new_zeros((*x.shape[:-1], m.out_features))
        for m in layers
    ]
    return out + torch.cat(terms, dim=-1)
