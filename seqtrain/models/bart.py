"""BART (fairseq's `bart` model): encoder-decoder transformer, learned positions, shared embeddings.

Parameter names are fairseq's, so fairseq checkpoints load with no renaming (fairseq's `encoder.version` /
`decoder.version` buffers are the only keys to drop). Forward signatures follow fairseq:

    logits, extra = model(src_tokens, src_lengths, prev_output_tokens)
    x, extra = model(src_tokens, src_lengths, prev_output_tokens, features_only=True)
    logits = model.output_layer(x[target.ne(pad)])        # project only the rows a criterion needs

Packed training: a batch from the collater carries `net_input["layout"]` (pair_dataset.batch_layout, made on
the CPU: each side's real tokens, their positions, cu_seqlens and a bucketed max length). With it the model
runs packed end to end: embeddings of the real tokens only, every layer on N x C, varlen attention
(models/varlen.py), and the output is packed too: the N rows of the real target positions in row-major order,
the rows `sample["target_rows"]` selects from a padded output, with `extra["packed"]` True. No mask, no
scatter, no gather, and no host-device sync. Without a layout (generation, a caller's own batch) the model runs
padded (B x T x C, SDPA with masks), finding the pads on the device: a sync for each stack's attention mask.
Generation's encoder pass may run packed all the same (`encoder(src_tokens, packed=True)`, --packed-encoder):
the padded batch's real tokens go through the packed stack and come back laid out B x S, so the decoder, the
beam search and the static path above it see what the padded pass gives them.

Incremental decoding (beam search): the caller creates `state = {}` and calls
`model.decoder(prev_output_tokens, encoder_out, incremental_state=state)` with the whole prefix each step; only
the last position is computed. The decoder batch may be `beam` times the encoder batch (rows b*beam..b*beam+beam-1
share encoder row b); encoder keys/values are computed once per sentence and cached in `state`.

Why one module: the config, the two stacks, the arch presets and the model flags describe one model; the
presets fill the flags the config reads, and fairseq's checkpoints name all of it together.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from seqtrain.config import add_choice_settings, field_default, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_FLOAT, PROBABILITY, Bounds
from seqtrain.models.lora import apply_lora, parse_targets
from seqtrain.models.resize import parse_layers_to_keep
from seqtrain.models.transformer import (
    ACTIVATIONS,
    INITS,
    LearnedPositionalEmbedding,
    Segments,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    embed_scale,
    make_positions,
    reorder_cache,
)
from seqtrain.models.varlen import kernel_fits
from seqtrain.registry import ARCHS

EncoderOut = dict[str, Tensor]
# generation's encoder pass on the CPU runs packed from this share of pads up (BartEncoder.packs_by_default):
# measured faster than padded from 20% pads for bart_small widths (bart_base from ~10%), no faster below 15%
CPU_PACK_MIN_PAD_SHARE = 0.2
Layout = dict[str, Any]


def _arch(default: Any, text: str, **kw: Any) -> Any:
    """A model setting: the field's default is bart_base's; the flag's is None, so the --arch preset fills what the
    command line and --config leave unset (seqtrain.flags.parsing)."""
    return setting(default, text, flag_default=None, **kw)


def _dim(default: int, text: str, hi: int) -> Any:
    return _arch(default, text, type=int, metavar="N", bounds=Bounds(1, hi))


def _keep(side: str) -> Any:
    return _arch(
        None,
        f"keep only these {side} layers (comma-separated indices, e.g. 0,5,11) of the loaded "
        f"checkpoint, renumbered from 0; sets --{side}-layers to their count (a smaller student from "
        "a deeper model, as fairseq prunes)",
        metavar="LIST",
    )


def _normalize_before(side: str) -> Any:
    return _arch(
        False,
        f"pre-norm {side} layers and a final layer norm (mBART's layout; bart presets: off)",
        action="store_true",
    )


@settings
class BartConfig:
    """Model configuration

    A BART model's settings, declared once: the fields are the Model flags (fairseq's names, in their --help
    order) and the built model's config (BARTModel(cfg)); vocab_size and tgt_vocab_size come from the
    dictionaries. The layers-to-keep, LoRA and accepted-only flags are read by build_model."""

    vocab_size: int = 1000
    tgt_vocab_size: int | None = None  # only when embeddings are not shared; None = vocab_size
    encoder_layers: int = _dim(6, "number of encoder layers", 1024)
    encoder_embed_dim: int = _dim(768, "encoder embedding dimension", 65536)
    encoder_ffn_embed_dim: int = _dim(3072, "encoder feed-forward dimension", 262144)
    encoder_attention_heads: int = _dim(12, "number of encoder attention heads", 1024)
    encoder_layers_to_keep: str | None = _keep("encoder")
    decoder_layers: int = _dim(6, "number of decoder layers", 1024)
    decoder_embed_dim: int = _dim(768, "decoder embedding dimension", 65536)
    decoder_ffn_embed_dim: int = _dim(3072, "decoder feed-forward dimension", 262144)
    decoder_attention_heads: int = _dim(12, "number of decoder attention heads", 1024)
    decoder_layers_to_keep: str | None = _keep("decoder")
    dropout: float = _arch(
        0.1, "dropout probability (bart presets: 0.1)", type=float, metavar="P", bounds=PROBABILITY
    )
    attention_dropout: float = _arch(
        0.0, "dropout on attention weights (bart presets: 0.0)", type=float, metavar="P", bounds=PROBABILITY
    )
    activation_dropout: float = _arch(
        0.0, "dropout after the FFN activation (0.0)", type=float, metavar="P", bounds=PROBABILITY
    )
    # fairseq's --relu-dropout is the old name of --activation-dropout (used when the latter is 0)
    relu_dropout: float | None = _arch(
        None, "old name of --activation-dropout", type=float, metavar="P", bounds=PROBABILITY
    )
    activation_fn: str = _arch("gelu", "FFN activation (bart presets: gelu)", choices=sorted(ACTIVATIONS))
    max_source_positions: int = _dim(1024, "max source length (1024)", 1 << 20)
    max_target_positions: int = _dim(1024, "max target length (1024)", 1 << 20)
    share_all_embeddings: bool = _arch(
        True,
        "share encoder, decoder and output embeddings (bart: on; needs a joined dictionary)",
        action=argparse.BooleanOptionalAction,
    )
    # Accepted because fairseq's BART fine-tuning commands pass them; BART always has both.
    share_decoder_input_output_embed: bool | None = _arch(
        None, "tie decoder input and output embeddings (bart: on)", action="store_true"
    )
    layernorm_embedding: bool | None = _arch(
        None, "layer norm after the embeddings (bart: on)", action="store_true"
    )
    no_scale_embedding: bool = _arch(
        True, "do not scale embeddings by sqrt(dim) (bart: on)", action="store_true"
    )
    # pre-norm layers and a final layer norm after each stack (fairseq's flags; mBART's layout; BART: False)
    encoder_normalize_before: bool = _normalize_before("encoder")
    decoder_normalize_before: bool = _normalize_before("decoder")
    # how a model trained from scratch starts: "bert" (BART's N(0, 0.02)) or "xavier" (fairseq's transformer)
    weight_init: str = _arch(
        "bert",
        "initial weights of a model trained from scratch: bert (BART's N(0, 0.02); default) or xavier "
        "(fairseq's transformer init: xavier-uniform layers, N(0, dim^-0.5) embeddings; learns far faster "
        "for small models). Ignored when weights are loaded",
        choices=["bert", "xavier"],
    )
    lora_rank: int | None = _arch(
        None,
        "LoRA: train rank-R adapters on --lora-modules of every layer, every other weight frozen (0: off)",
        type=int,
        metavar="R",
        bounds=Bounds(0, 65536),  # 0: off; at most the widest --*-embed-dim (apply_lora: the model's own)
    )
    lora_alpha: float | None = _arch(
        None,
        "LoRA scaling numerator: adapters scale by A / R (16)",
        type=float,
        metavar="A",
        bounds=POSITIVE_FLOAT,
    )
    lora_dropout: float | None = _arch(
        None, "dropout on the adapters' input (0.0)", type=float, metavar="P", bounds=PROBABILITY
    )
    lora_modules: str | None = _arch(
        None,
        "projections that get adapters, comma-separated from q_proj,k_proj,v_proj,out_proj,fc1,fc2 "
        "(q_proj,v_proj)",
        metavar="LIST",
    )
    checkpoint_activations: bool = _arch(
        False,
        "recompute each layer's activations in the backward pass (less memory, more compute)",
        action="store_true",
    )


def _check_config(cfg: BartConfig) -> None:
    for side in ("encoder", "decoder"):
        dim, heads = getattr(cfg, f"{side}_embed_dim"), getattr(cfg, f"{side}_attention_heads")
        if heads <= 0 or dim % heads:
            raise SeqtrainError(
                f"--{side}-embed-dim {dim} must be divisible by --{side}-attention-heads {heads}"
            )
    if cfg.share_all_embeddings and cfg.encoder_embed_dim != cfg.decoder_embed_dim:
        raise SeqtrainError(
            f"--share-all-embeddings needs --encoder-embed-dim ({cfg.encoder_embed_dim}) "
            f"== --decoder-embed-dim ({cfg.decoder_embed_dim})"
        )
    if cfg.weight_init not in INITS:
        raise SeqtrainError(f"--weight-init {cfg.weight_init!r}: choose from {', '.join(INITS)}")
    if cfg.activation_fn not in ACTIVATIONS:
        raise SeqtrainError(f"--activation-fn {cfg.activation_fn!r}: choose from {', '.join(ACTIVATIONS)}")


def _run_layer(layer: nn.Module, use_checkpoint: bool, *inputs: Any) -> Tensor:
    if use_checkpoint:
        return checkpoint(layer, *inputs, use_reentrant=False)
    return layer(*inputs)


class BartEncoder(nn.Module):
    def __init__(self, cfg: BartConfig, embed_tokens: nn.Embedding, padding_idx: int):
        super().__init__()
        dim = cfg.encoder_embed_dim
        self.padding_idx = padding_idx
        self.dropout = cfg.dropout
        self.max_source_positions = cfg.max_source_positions
        self.checkpoint_activations = cfg.checkpoint_activations
        self.embed_scale = embed_scale(dim, cfg.no_scale_embedding)
        self.embed_tokens = embed_tokens
        self.embed_positions = LearnedPositionalEmbedding(cfg.max_source_positions, dim, padding_idx)
        self.layernorm_embedding = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                dim,
                cfg.encoder_ffn_embed_dim,
                cfg.encoder_attention_heads,
                cfg.dropout,
                cfg.attention_dropout,
                cfg.activation_dropout,
                cfg.activation_fn,
                cfg.encoder_normalize_before,
            )
            for _ in range(cfg.encoder_layers)
        )
        # pre-norm stacks end with a layer norm (fairseq's encoder.layer_norm); post-norm ones have none
        self.layer_norm = nn.LayerNorm(dim) if cfg.encoder_normalize_before else None

    # generation may ask this encoder to run a padded batch packed (`packed=` below; generation's `encode`)
    supports_packed = True

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None = None,
        layout: Layout | None = None,
        packed: bool | None = False,
    ) -> EncoderOut:
        """src_tokens: B x S (left or right padded). Returns {"encoder_out": B x S x C,
        "encoder_padding_mask": B x S bool (True at pads)}. src_lengths is accepted for fairseq's signature;
        the padding mask is read from the tokens. With `layout` (the collater's, see the module docstring):
        {"encoder_out": M x C}, the M real tokens packed. `packed` (generation's encoder pass): the real tokens
        of the padded batch run packed (forward_padded_as_packed), the output laid out B x S as the padded
        pass's; None: where that is the faster pass (packs_by_default)."""
        if src_tokens.size(1) > self.max_source_positions:
            raise SeqtrainError(
                f"source of {src_tokens.size(1)} tokens exceeds --max-source-positions {self.max_source_positions}"
            )
        if layout is not None:
            return {"encoder_out": self.forward_packed(layout)}
        padding_mask = src_tokens.eq(self.padding_idx)
        if packed is None:
            packed = self.packs_by_default(padding_mask)
        if packed:
            return {
                "encoder_out": self.forward_padded_as_packed(src_tokens, padding_mask),
                "encoder_padding_mask": padding_mask,
            }
        x = self._embed(src_tokens, self.embed_positions(src_tokens))
        attn_mask = _attn_mask(padding_mask)
        use_ckpt = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            x = _run_layer(layer, use_ckpt, x, attn_mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return {"encoder_out": x, "encoder_padding_mask": padding_mask}

    def _embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        x = self.embed_scale * self.embed_tokens(tokens) + positions
        x = self.layernorm_embedding(x)
        if self.training and self.dropout:  # (F.dropout would return x itself: one operator less a step)
            x = F.dropout(x, self.dropout, True)
        return x

    def forward_packed(self, layout: Layout) -> Tensor:
        """The real source tokens of a collated batch through the stack, packed: M x C."""
        x = self._embed(layout["src_tokens"], _positions(self.embed_positions, layout["src_positions"]))
        segments = _segments(layout, "src")
        use_ckpt = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            x = _run_layer(layer, use_ckpt, x, None, segments)
        return x if self.layer_norm is None else self.layer_norm(x)

    def forward_padded_as_packed(self, src_tokens: Tensor, padding_mask: Tensor) -> Tensor:
        """The padded batch's real tokens through forward_packed, laid back out B x S x C (zeros at the pads,
        which every reader masks). Positions are make_positions' (padding_idx + 1, + 2, ... over a row's real
        tokens, as the padded pass embeds them on either padding side), so the real rows equal the padded
        pass's to rounding (tests/unit/generation/test_packed_encoder.py).

        The row lengths come to the host in one read (the padded pass reads whether there are pads instead:
        one sync either way, none on the CPU): the dispatcher's CPU reference reads its segment bounds there and
        the CUDA kernel sizes its grid by the host max length; the real tokens' rows are found on the device
        with that count known (nonzero_static: no second sync)."""
        b, s = src_tokens.shape
        keep = ~padding_mask
        lengths: list[int] = keep.sum(1).tolist()
        cu_host = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        rows = torch.nonzero_static(keep.view(-1), size=sum(lengths)).squeeze(1)
        layout = {
            "src_tokens": src_tokens.reshape(-1).index_select(0, rows),
            "src_positions": make_positions(src_tokens, self.padding_idx).view(-1).index_select(0, rows),
            "src_cu_seqlens": cu_host.to(src_tokens.device, non_blocking=True),  # (kept alive: the bounds)
            "src_cu_seqlens_host": cu_host,
            "src_max_len": max(lengths, default=0),
        }
        x = self.forward_packed(layout)
        return x.new_zeros(b * s, x.size(-1)).index_copy_(0, rows, x).view(b, s, -1)

    def packs_by_default(self, padding_mask: Tensor) -> bool:
        """Whether generation's encoder pass runs packed when not told (`packed=None`): on CUDA where torch's
        varlen flash kernel serves (fp16/bf16, under autocast too; off it the dispatcher loops over the
        sentences), on the CPU when at least CPU_PACK_MIN_PAD_SHARE of the batch is pads (the CPU reference lays
        each layer's q, k and v out padded again, which costs more than the pads' FFN work it saves below
        that: docs/benchmarks.md, the packed encoder for generation)."""
        device = padding_mask.device
        if device.type == "cpu":
            pads = int(padding_mask.sum())
            return pads > 0 and pads >= CPU_PACK_MIN_PAD_SHARE * padding_mask.numel()
        if device.type != "cuda" or not len(self.layers):
            return False
        autocast = torch.is_autocast_enabled(device.type)
        dtype = torch.get_autocast_dtype(device.type) if autocast else self.embed_tokens.weight.dtype
        return kernel_fits(True, dtype, self.layers[0].self_attn.head_dim, 0.0)

    @staticmethod
    def reorder_encoder_out(encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        """Select encoder rows (sentences) by `new_order`."""
        return {k: v.index_select(0, new_order) if torch.is_tensor(v) else v for k, v in encoder_out.items()}


class BartDecoder(nn.Module):
    def __init__(self, cfg: BartConfig, embed_tokens: nn.Embedding, padding_idx: int):
        super().__init__()
        dim = cfg.decoder_embed_dim
        self.padding_idx = padding_idx
        self.dropout = cfg.dropout
        self.max_target_positions = cfg.max_target_positions
        self.checkpoint_activations = cfg.checkpoint_activations
        self.embed_scale = embed_scale(dim, cfg.no_scale_embedding)
        self.embed_tokens = embed_tokens
        self.embed_positions = LearnedPositionalEmbedding(cfg.max_target_positions, dim, padding_idx)
        self.layernorm_embedding = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(
                dim,
                cfg.decoder_ffn_embed_dim,
                cfg.decoder_attention_heads,
                cfg.encoder_embed_dim,
                cfg.dropout,
                cfg.attention_dropout,
                cfg.activation_dropout,
                cfg.activation_fn,
                cfg.decoder_normalize_before,
            )
            for _ in range(cfg.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dim) if cfg.decoder_normalize_before else None
        # Tied to embed_tokens (BARTModel.tie_weights): one tensor, three names in the state dict, as fairseq.
        self.output_projection = nn.Linear(dim, embed_tokens.num_embeddings, bias=False)

    def output_layer(self, x: Tensor) -> Tensor:
        """Hidden states (any leading shape) x C -> logits over the vocabulary."""
        return self.output_projection(x)

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: EncoderOut | None = None,
        incremental_state: dict[str, Any] | None = None,
        features_only: bool = False,
        layout: Layout | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        """prev_output_tokens: (B*beam) x T, right-padded. With `incremental_state`, the first T-1 positions must
        already be cached by earlier calls and only position T is computed (output (B*beam) x 1 x V).
        With `layout` (the collater's, see the module docstring; `encoder_out` then packed too) the output is
        packed: forward_packed."""
        t = prev_output_tokens.size(1)
        if t > self.max_target_positions:
            raise SeqtrainError(
                f"target of {t} tokens exceeds --max-target-positions {self.max_target_positions}"
            )
        if layout is not None:
            assert encoder_out is not None and incremental_state is None
            return self.forward_packed(layout, encoder_out["encoder_out"], features_only)
        state = incremental_state
        if state is not None:
            cached = state.get("steps", 0)
            if cached != t - 1:
                raise ValueError(
                    f"incremental_state holds {cached} steps but prev_output_tokens has {t} positions"
                )
            tokens = prev_output_tokens[:, -1:]
            positions = self.embed_positions(tokens, step=t)  # fairseq: padding_idx + step for every row
        else:
            tokens = prev_output_tokens
            positions = self.embed_positions(tokens)
        x = self._embed(tokens, positions)
        memory = memory_mask = None
        if encoder_out is not None:
            memory = encoder_out["encoder_out"]
            if state is not None:
                if "encoder_attn_mask" not in state:
                    state["encoder_attn_mask"] = _attn_mask(encoder_out["encoder_padding_mask"])
                memory_mask = state["encoder_attn_mask"]
            else:
                memory_mask = _attn_mask(encoder_out["encoder_padding_mask"])
        inner_states: list[Tensor] = [x]
        use_ckpt = self.checkpoint_activations and self.training and torch.is_grad_enabled() and state is None
        for i, layer in enumerate(self.layers):
            if state is not None:
                self_cache = state.setdefault(f"layers.{i}.self_attn", {})
                cross_cache = state.setdefault(f"layers.{i}.encoder_attn", {})
                x = layer(x, memory, memory_mask, self_cache, cross_cache)
            else:
                x = _run_layer(layer, use_ckpt, x, memory, memory_mask)
            inner_states.append(x)
        if state is not None:
            state["steps"] = t
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        extra = {"attn": [None], "inner_states": inner_states}
        return (x if features_only else self.output_layer(x)), extra

    _embed = BartEncoder._embed

    def forward_packed(
        self, layout: Layout, memory: Tensor, features_only: bool = False
    ) -> tuple[Tensor, dict[str, Any]]:
        """The real decoder-input tokens of a collated batch through the stack, attending to the packed
        encoder output `memory` (M x C): N x C features (N x V logits), packed, extra["packed"] True."""
        x = self._embed(layout["tgt_tokens"], _positions(self.embed_positions, layout["tgt_positions"]))
        segments, memory_segments = _segments(layout, "tgt"), _segments(layout, "src")
        use_ckpt = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        inner_states: list[Tensor] = [x]
        for layer in self.layers:
            x = _run_layer(layer, use_ckpt, x, memory, None, None, None, segments, memory_segments)
            inner_states.append(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        extra = {"attn": [None], "inner_states": inner_states, "packed": True}
        return (x if features_only else self.output_layer(x)), extra

    def reorder_incremental_state(
        self, incremental_state: dict[str, Any], new_order: Tensor, encoder_order: Tensor | None = None
    ) -> None:
        """In place: decoder-row caches follow `new_order`; encoder-row caches follow `encoder_order` if given."""
        for key, value in incremental_state.items():
            if key.endswith(".self_attn"):
                reorder_cache(value, new_order)
            elif encoder_order is not None and key.endswith(".encoder_attn"):
                for name in value:
                    value[name] = value[name].index_select(0, encoder_order)
        mask = incremental_state.get("encoder_attn_mask")
        if encoder_order is not None and mask is not None:
            incremental_state["encoder_attn_mask"] = mask.index_select(0, encoder_order)


def _attn_mask(padding_mask: Tensor) -> Tensor | None:
    """B x S pad mask (True at pads) -> B x 1 x 1 x S attend mask (True = attend), or None without pads
    (no mask lets CUDA pick the flash kernel; finding out is a device sync)."""
    return (~padding_mask)[:, None, None, :] if bool(padding_mask.any()) else None


def _segments(layout: Layout, side: str) -> Segments:
    return Segments(
        layout[f"{side}_cu_seqlens"], layout[f"{side}_max_len"], layout.get(f"{side}_cu_seqlens_host")
    )


def _positions(table: LearnedPositionalEmbedding, positions: Tensor) -> Tensor:
    """The learned position embeddings of packed tokens, `positions` as make_positions gives them."""
    return F.embedding(positions, table.weight, table.padding_idx)


class BARTModel(nn.Module):
    def __init__(self, cfg: BartConfig, padding_idx: int = 1):
        super().__init__()
        _check_config(cfg)
        self.cfg = cfg
        self.padding_idx = padding_idx
        enc_embed = nn.Embedding(cfg.vocab_size, cfg.encoder_embed_dim, padding_idx)
        if cfg.share_all_embeddings:
            if cfg.tgt_vocab_size not in (None, cfg.vocab_size):
                raise SeqtrainError(
                    f"--share-all-embeddings needs one dictionary: source has {cfg.vocab_size} symbols, "
                    f"target {cfg.tgt_vocab_size}"
                )
            dec_embed = enc_embed
        else:
            dec_embed = nn.Embedding(cfg.tgt_vocab_size or cfg.vocab_size, cfg.decoder_embed_dim, padding_idx)
        self.encoder = BartEncoder(cfg, enc_embed, padding_idx)
        self.decoder = BartDecoder(cfg, dec_embed, padding_idx)
        self.tie_weights()
        INITS[cfg.weight_init](self)
        # The tied output projection is a Linear that apply() re-drew after the embedding; zero the pad rows last.
        with torch.no_grad():
            for emb in (enc_embed, dec_embed):
                emb.weight[padding_idx].zero_()

    def tie_weights(self) -> None:
        """(Re)tie the output projection to the decoder embedding, and the decoder embedding to the encoder's when
        sharing all embeddings. Call again after anything that replaces parameters (e.g. `to_empty()` after
        building on the meta device, or `load_state_dict(assign=True)`)."""
        if self.cfg.share_all_embeddings:
            self.decoder.embed_tokens.weight = self.encoder.embed_tokens.weight
        self.decoder.output_projection.weight = self.decoder.embed_tokens.weight

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Tensor | None,
        prev_output_tokens: Tensor,
        features_only: bool = False,
        layout: Layout | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        """`layout`: the collater's net_input["layout"] (see the module docstring); optional. With it the
        output is packed (the real target positions' rows) and extra["packed"] is True."""
        encoder_out = self.encoder(src_tokens, src_lengths, layout)
        return self.decoder(prev_output_tokens, encoder_out, features_only=features_only, layout=layout)

    def output_layer(self, x: Tensor) -> Tensor:
        return self.decoder.output_layer(x)

    def get_normalized_probs(self, net_output: tuple[Tensor, Any], log_probs: bool) -> Tensor:
        """fairseq's helper: (log-)softmax over the vocabulary, computed in float32."""
        logits = net_output[0].float()
        return F.log_softmax(logits, dim=-1) if log_probs else F.softmax(logits, dim=-1)

    def max_positions(self) -> tuple[int, int]:
        return self.cfg.max_source_positions, self.cfg.max_target_positions


# ---------------------------------------------------------------- arch presets and flags


# A preset fills the fields `cfg` leaves None: a BartConfig from arch_config, or the parsed flags, which the
# parser hands it so that --print-config and the checkpoints' args show the sizes (fairseq's arch functions do
# the same to their args; a --user-dir arch written that way works on either).
def _fill(cfg: Any, **defaults: Any) -> None:
    for name, value in defaults.items():
        if getattr(cfg, name, None) is None:
            setattr(cfg, name, value)


def _fill_common(cfg: Any, dim: int, ffn: int, layers: int, heads: int) -> None:
    """fairseq's bart_large_architecture logic: decoder sizes default to the encoder's (so --encoder-* flags
    carry over), dropout 0.1, attention/activation dropout 0, 1024 positions, shared embeddings, GELU."""
    _fill(
        cfg,
        encoder_embed_dim=dim,
        encoder_ffn_embed_dim=ffn,
        encoder_layers=layers,
        encoder_attention_heads=heads,
    )
    _fill(
        cfg,
        decoder_embed_dim=cfg.encoder_embed_dim,
        decoder_ffn_embed_dim=cfg.encoder_ffn_embed_dim,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_fn="gelu",
        max_source_positions=1024,
        max_target_positions=1024,
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        layernorm_embedding=True,
        no_scale_embedding=True,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        weight_init="bert",
        checkpoint_activations=False,
    )


@ARCHS.register("bart_large", config=BartConfig)
def bart_large(cfg: Any) -> None:
    _fill_common(cfg, 1024, 4096, 12, 16)


@ARCHS.register("bart_base", config=BartConfig)
def bart_base(cfg: Any) -> None:
    _fill_common(cfg, 768, 3072, 6, 12)


@ARCHS.register("bart_small", config=BartConfig)
def bart_small(cfg: Any) -> None:
    _fill_common(cfg, 256, 1024, 3, 4)


@ARCHS.register("bart_tiny", config=BartConfig)
def bart_tiny(cfg: Any) -> None:
    _fill_common(cfg, 64, 128, 2, 4)


def _fill_mbart(cfg: Any) -> None:
    """mBART's layout over BART's sizes: fairseq's mbart_*_architecture scales the embeddings by sqrt(dim), and
    mBART is pre-norm (each stack ends with a layer norm), which fairseq's recipes (examples/mbart) ask for with
    --encoder-normalize-before --decoder-normalize-before; here the preset sets it, as the released models
    have it."""
    _fill(cfg, no_scale_embedding=False, encoder_normalize_before=True, decoder_normalize_before=True)


@ARCHS.register("mbart_large", config=BartConfig)
def mbart_large(cfg: Any) -> None:
    _fill_mbart(cfg)
    bart_large(cfg)


@ARCHS.register("mbart_base", config=BartConfig)
def mbart_base(cfg: Any) -> None:
    _fill_mbart(cfg)
    bart_base(cfg)


ARCHS.common = BartConfig  # a --user-dir arch (a preset over BartConfig's fields) registered without settings


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Model flags (fairseq's names): the settings the archs register with (BartConfig's; a --user-dir arch's
    own after them). All default to None so the --arch preset fills what is not given; a flag another component
    already added (e.g. the task's --max-source-positions) is not added twice."""
    return add_choice_settings(parser, ARCHS.configs(), "Model configuration")


def arch_config(arch: str = "bart_base", /, **given: Any) -> BartConfig:
    """The BartConfig of preset `arch` (a registered arch, --user-dir ones included), with the fields `given`
    (fairseq's names; others are ignored) winning over it: the preset fills only what they leave None."""
    try:
        preset = ARCHS.get(arch)
    except KeyError as e:
        raise SeqtrainError(f"--arch: {e.args[0]}") from None
    names = {f.name for f in fields(BartConfig)}
    cfg = BartConfig(**{n: given.get(n) for n in names})
    preset(cfg)
    for f in fields(BartConfig):  # what the preset leaves unset keeps the field's default
        if getattr(cfg, f.name) is None:
            setattr(cfg, f.name, field_default(f))
    return cfg


def as_built(cfg: BartConfig) -> BartConfig:
    """`cfg` with the layer counts of the model build_model makes of it: fairseq's count follows
    --encoder/decoder-layers-to-keep (a run's checkpoints record the model that was built)."""
    changes: dict[str, Any] = {}
    for side in ("encoder", "decoder"):
        keep = parse_layers_to_keep(getattr(cfg, f"{side}_layers_to_keep"), f"--{side}-layers-to-keep")
        if keep is not None:
            changes[f"{side}_layers"] = len(keep)
    return replace(cfg, **changes)


def build_model(cfg: BartConfig, src_dict: Any, tgt_dict: Any) -> BARTModel:
    """A BARTModel of `cfg` (its preset already applied: the parsed flags, or arch_config) for these
    dictionaries; their sizes set the vocabulary."""
    cfg = as_built(cfg)
    changes: dict[str, Any] = {}
    for flag in ("share_decoder_input_output_embed", "layernorm_embedding"):
        if getattr(cfg, flag) is False:
            raise SeqtrainError(f"--{flag.replace('_', '-')} is always on in BART; it cannot be turned off")
    pad = src_dict.pad() if hasattr(src_dict, "pad") else 1
    tgt_pad = tgt_dict.pad() if hasattr(tgt_dict, "pad") else 1
    if pad != tgt_pad:
        raise SeqtrainError(f"source and target dictionaries disagree on the pad index ({pad} vs {tgt_pad})")
    if cfg.share_all_embeddings and len(src_dict) != len(tgt_dict):
        raise SeqtrainError(
            f"--share-all-embeddings needs a joined dictionary: source has {len(src_dict)} symbols, "
            f"target {len(tgt_dict)} (preprocess with --joined-dictionary, or pass --no-share-all-embeddings)"
        )
    if not cfg.activation_dropout and cfg.relu_dropout:  # fairseq's old name, read when the new one is 0
        changes["activation_dropout"] = cfg.relu_dropout
    cfg = replace(
        cfg,
        vocab_size=len(src_dict),
        tgt_vocab_size=None if cfg.share_all_embeddings else len(tgt_dict),
        **changes,
    )
    model = BARTModel(cfg, padding_idx=pad)
    if cfg.lora_rank:
        apply_lora(
            model,
            cfg.lora_rank,
            16.0 if cfg.lora_alpha is None else cfg.lora_alpha,
            cfg.lora_dropout or 0.0,
            parse_targets(cfg.lora_modules),
        )
    return model
