"""Transformer building blocks for BART: attention with a key/value cache, post-norm layers, positions.

Tensors are batch-first (B x T x C) everywhere. Attention runs through
`torch.nn.functional.scaled_dot_product_attention` so PyTorch picks the fastest kernel (flash / memory-efficient
on CUDA). Masks are boolean and broadcast (True = may attend), never large float tensors.

Module and parameter names mirror fairseq's (`self_attn.k_proj`, `encoder_attn_layer_norm`, `fc1`, ...) so a
fairseq state dict loads without renaming; definition order follows fairseq too, so `state_dict()` lists keys in
the same order as a fairseq checkpoint.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# One cache entry per attention module: {"k": B x H x T x d, "v": B x H x T x d}.
Cache = Dict[str, Tensor]


def _gelu_accurate(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: Dict[str, Callable[[Tensor], Tensor]] = {
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

    def forward(self, tokens: Tensor, step: Optional[int] = None) -> Tensor:  # type: ignore[override]
        """Positions for `tokens` (B x T); with `step` (incremental decoding) one position for every row."""
        if step is not None:
            return self.weight[self.padding_idx + step].view(1, 1, -1)
        return super().forward(make_positions(tokens, self.padding_idx))


class MultiheadAttention(nn.Module):
    """Multi-head attention with fairseq's parameter names (k_proj, v_proj, q_proj, out_proj).

    `kdim` is the width of the keys/values source (the encoder's for cross-attention).
    """

    def __init__(self, embed_dim: int, num_heads: int, kdim: Optional[int] = None, dropout: float = 0.0):
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

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.embed_dim)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool = False) -> Tensor:
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)

    def self_attention(
        self, x: Tensor, mask: Optional[Tensor] = None, is_causal: bool = False, cache: Optional[Cache] = None
    ) -> Tensor:
        """x: B x T x C. mask: bool, broadcastable to B x H x T x T. With `cache`, new keys/values are appended
        to the cached ones, and queries attend to all of them (the caller feeds one step at a time)."""
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
            is_causal = False  # one new query sees every cached key
        return self.out_proj(self._merge(self._sdpa(q, k, v, mask, is_causal)))

    def cross_attention(
        self, x: Tensor, memory: Optional[Tensor], mask: Optional[Tensor], cache: Optional[Cache] = None
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
        beam, h, d = bq // bk, self.num_heads, self.head_dim
        q = self.q_proj(x).view(bk, beam, t, h, d).permute(0, 3, 1, 2, 4).reshape(bk, h, beam * t, d)
        o = self._sdpa(q, k, v, mask)  # bk x h x beam*t x d
        o = o.view(bk, h, beam, t, d).permute(0, 2, 3, 1, 4).reshape(bq, t, self.embed_dim)
        return self.out_proj(o)


class _FeedForward(nn.Module):
    """Mixin holding fc1/fc2 and the dropout settings shared by both layer kinds."""

    def _init_ffn(self, embed_dim: int, ffn_dim: int, dropout: float, activation_dropout: float, activation_fn: str):
        if activation_fn not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation_fn!r}; choose from {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation_fn]
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, self.training)

    def _ffn_block(self, x: Tensor) -> Tensor:
        h = F.dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)
        return self.final_layer_norm(x + self._drop(self.fc2(h)))


class TransformerEncoderLayer(_FeedForward):
    """Post-norm encoder layer (fairseq's with normalize_before=False): x = LN(x + drop(sublayer(x)))."""

    def __init__(
        self, embed_dim: int, ffn_dim: int, heads: int, dropout: float = 0.1, attention_dropout: float = 0.0,
        activation_dropout: float = 0.0, activation_fn: str = "gelu",
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self._init_ffn(embed_dim, ffn_dim, dropout, activation_dropout, activation_fn)

    def forward(self, x: Tensor, mask: Optional[Tensor]) -> Tensor:
        x = self.self_attn_layer_norm(x + self._drop(self.self_attn.self_attention(x, mask)))
        return self._ffn_block(x)


class TransformerDecoderLayer(_FeedForward):
    """Post-norm decoder layer: causal self-attention, cross-attention to the encoder, feed-forward."""

    def __init__(
        self, embed_dim: int, ffn_dim: int, heads: int, encoder_embed_dim: Optional[int] = None,
        dropout: float = 0.1, attention_dropout: float = 0.0, activation_dropout: float = 0.0,
        activation_fn: str = "gelu",
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.encoder_attn = MultiheadAttention(embed_dim, heads, kdim=encoder_embed_dim, dropout=attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)
        self._init_ffn(embed_dim, ffn_dim, dropout, activation_dropout, activation_fn)

    def forward(
        self, x: Tensor, memory: Optional[Tensor], memory_mask: Optional[Tensor],
        self_cache: Optional[Cache] = None, cross_cache: Optional[Cache] = None,
    ) -> Tensor:
        # Decoder inputs are right-padded, so the causal mask alone is exact for real positions, and pad
        # positions always see at least position 0 (no all-masked rows, hence no NaN).
        h = self.self_attn.self_attention(x, is_causal=x.size(1) > 1, cache=self_cache)
        x = self.self_attn_layer_norm(x + self._drop(h))
        h = self.encoder_attn.cross_attention(x, memory, memory_mask, cache=cross_cache)
        x = self.encoder_attn_layer_norm(x + self._drop(h))
        return self._ffn_block(x)


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


def embed_scale(dim: int, no_scale_embedding: bool) -> float:
    return 1.0 if no_scale_embedding else math.sqrt(dim)
