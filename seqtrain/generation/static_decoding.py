"""A static-shape decoding step for BART, so that one step can be captured once and replayed as a CUDA graph.

The eager step (seqtrain.models.bart's incremental decoding) gives every step a new key length and every
compaction a new batch, so nothing in it can be captured, and a GPU waits on the host's ~160 kernel launches a
step. Here every tensor a step touches has a fixed shape and address for the life of a `StepBuffers`:

- rows: `slots` sentence slots x beam, `slots` a power of two (bucket); finished sentences leave only when the
  live count falls to half the slots, and the rest of the slots hold finished (or filler) sentences;
- self-attention: per layer one buffer of keys and values, rows x `tgt_cap` x 2 x H x d, written at the step
  index (a device tensor), attended over its whole capacity with a length mask (positions <= step);
- cross-attention: the encoder's keys/values per layer, slots x H x `src_cap` x d, the source padded to a
  power-of-two bucket and masked;
- beam reordering: one gather of each layer's buffer by the row order (a device tensor) into a spare buffer
  and a copy back, inside the step, so the step's inputs are three small device tensors (the last tokens, the
  step index, the row order) that the host overwrites in place.

`StaticDecoder` keeps one StepBuffers per (slots, src_cap, tgt_cap) for the whole run, and on CUDA one
`torch.cuda.CUDAGraph` of its step (captured when the buffers are first built, warmed up on a side stream, every
graph in one memory pool). On the CPU the same step runs eagerly (`--static-decoding`): that is how CI checks it.
The arithmetic is the eager step's; only the reductions run over the padded lengths, so results agree with the
eager path to rounding (fp32: the same hypotheses, tests/unit/generation/test_static_decoding.py).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrain.cuda import align_rows, padded_weight
from seqtrain.models.lora import LoRALinear

MIN_BUCKET = 16  # the smallest source and target capacity: fewer graphs for short inputs


def bucket(n: int, minimum: int = 1) -> int:
    """The power of two >= max(n, minimum)."""
    n = max(n, minimum, 1)
    return 1 << (n - 1).bit_length()


def fused_qkv(attn: nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """q, k and v projections as one weight (and bias), as the eager step fuses them (LoRA folded in)."""
    layers = (attn.q_proj, attn.k_proj, attn.v_proj)
    weight = torch.cat([m.effective_weight() if isinstance(m, LoRALinear) else m.weight for m in layers])
    has_bias = all(m.bias is not None for m in layers)
    bias = torch.cat([m.bias for m in layers]) if has_bias else None
    return weight.to(dtype), None if bias is None else bias.to(dtype)


class StepBuffers:
    """Every tensor one static step reads or writes, for `slots` x `beam` rows (see the module docstring)."""

    def __init__(
        self,
        decoder: nn.Module,
        slots: int,
        beam: int,
        src_cap: int,
        tgt_cap: int,
        dtype: torch.dtype | None = None,
    ):
        """`dtype`: the keys' and values' (default the model's; under autocast the autocast dtype, which the
        projections then produce)."""
        p = decoder.embed_tokens.weight
        layer0 = decoder.layers[0].self_attn
        h, d = layer0.num_heads, layer0.head_dim
        rows = slots * beam
        self.slots, self.beam, self.src_cap, self.tgt_cap = slots, beam, src_cap, tgt_cap
        self.dtype = dtype = dtype or p.dtype
        self.kv = [p.new_zeros(rows, tgt_cap, 2, h, d, dtype=dtype) for _ in decoder.layers]
        self.spare = p.new_zeros(rows, tgt_cap, 2, h, d, dtype=dtype)  # the reorder's gather target, shared
        self.enc_k = [p.new_zeros(slots, h, src_cap, d, dtype=dtype) for _ in decoder.layers]
        self.enc_v = [p.new_zeros(slots, h, src_cap, d, dtype=dtype) for _ in decoder.layers]
        self.enc_mask = torch.ones(slots, 1, 1, src_cap, dtype=torch.bool, device=p.device)
        self.tokens = torch.full((rows,), decoder.padding_idx, dtype=torch.long, device=p.device)
        self.step = torch.zeros(1, dtype=torch.long, device=p.device)
        self.identity = torch.arange(rows, device=p.device)
        self.order = self.identity.clone()
        self.positions = torch.arange(tgt_cap, device=p.device)
        self.logits: Tensor | None = None  # the captured step's output (CUDA graphs)

    def load_encoder(
        self, keys: list[Tensor], values: list[Tensor], pad_mask: Tensor, slot_rows: Tensor
    ) -> None:
        """Per layer the encoder's keys/values (B x H x S x d) and its pad mask (B x S, True at pads), slot i
        holding sentence slot_rows[i]; the source is left in the first S positions, the rest masked."""
        s = pad_mask.size(1)
        for buf, src in zip(self.enc_k + self.enc_v, keys + values):
            buf[:, :, :s].copy_(src.index_select(0, slot_rows))
            buf[:, :, s:].zero_()
        self.enc_mask.fill_(False)
        self.enc_mask[:, 0, 0, :s].copy_(~pad_mask.index_select(0, slot_rows))

    def take(self, other: StepBuffers, rows: Tensor, slots: Tensor) -> None:
        """Fill from `other` (a larger batch): decoder rows `rows` and encoder slots `slots` of it."""
        for mine, theirs in zip(self.kv, other.kv):
            torch.index_select(theirs, 0, rows, out=mine)
        for mine, theirs in zip(self.enc_k + self.enc_v, other.enc_k + other.enc_v):
            torch.index_select(theirs, 0, slots, out=mine)
        torch.index_select(other.enc_mask, 0, slots, out=self.enc_mask)


def aligned_output_weight(decoder: nn.Module, dtype: torch.dtype, align: int | None = None) -> Tensor | None:
    """The decoder's output projection weight in `dtype`, zero-padded to a multiple of `align` rows (default:
    8 on CUDA, none on the CPU; seqtrain.cuda.align_rows), or None when there is nothing
    to pad or the projection is not a plain bias-free nn.Linear. At BART's odd V = 50,265 the logits' rows are
    not 16-byte aligned and cuBLAS runs the step's largest product in align1 kernels (~100 TFLOP/s against
    570-800 aligned, an H200 in bf16, 2026-12-04); the padded weight's extra logits are zero and sliced off."""
    proj = getattr(decoder, "output_projection", None)
    if type(proj) is not nn.Linear or proj.bias is not None:
        return None
    weight = proj.weight
    align = align_rows(weight.device, align)
    if weight.size(0) % align == 0:
        return None
    return padded_weight(weight, align, dtype)


class StaticStep:
    """The decoding step of a BartDecoder on StepBuffers: reorder, then one position for every row; on CUDA
    the output projection against its weight padded to 8 rows (aligned_output_weight; `align` overrides)."""

    def __init__(self, decoder: nn.Module, align: int | None = None):
        self.decoder = decoder
        dtype = decoder.embed_tokens.weight.dtype
        self.qkv = [fused_qkv(layer.self_attn, dtype) for layer in decoder.layers]
        self.out_weight = aligned_output_weight(decoder, dtype, align)

    def refresh(self) -> None:
        """Copy the current q/k/v weights into the fused ones in place: captured graphs read them by address,
        and a model trained between two runs (ROUGE validation) must not decode with stale weights. The same
        for the padded output weight."""
        dtype = self.decoder.embed_tokens.weight.dtype
        for (weight, bias), layer in zip(self.qkv, self.decoder.layers):
            new_weight, new_bias = fused_qkv(layer.self_attn, dtype)
            weight.copy_(new_weight)
            if bias is not None and new_bias is not None:
                bias.copy_(new_bias)
        if self.out_weight is not None:
            w = self.decoder.output_projection.weight
            self.out_weight[: w.size(0)].copy_(w)

    def encoder_kv(self, memory: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Each layer's cross-attention keys and values (B x H x S x d), as the eager step computes them."""
        keys, values = [], []
        for layer in self.decoder.layers:
            attn = layer.encoder_attn
            keys.append(attn._heads(attn.k_proj(memory)))
            values.append(attn._heads(attn.v_proj(memory)))
        return keys, values

    def __call__(self, buf: StepBuffers) -> Tensor:
        """Logits (rows x V) of the next token of every row; the step's keys/values are written into `buf`."""
        dec = self.decoder
        for kv in buf.kv:  # beam reordering (and the identity after a compaction): a gather and a copy back
            torch.index_select(kv, 0, buf.order, out=buf.spare)
            kv.copy_(buf.spare)
        pos = dec.embed_positions.weight.index_select(0, buf.step + (dec.embed_positions.padding_idx + 1))
        x = dec.embed_scale * dec.embed_tokens(buf.tokens).unsqueeze(1) + pos.unsqueeze(0)
        x = dec.layernorm_embedding(x)
        self_mask = (buf.positions <= buf.step).view(1, 1, 1, -1)
        for i, layer in enumerate(dec.layers):
            x = layer._residual(
                x, layer.self_attn_layer_norm, partial(self._self_attn, buf, i, mask=self_mask)
            )
            x = layer._residual(x, layer.encoder_attn_layer_norm, partial(self._cross_attn, buf, i))
            x = layer._ffn_block(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if self.out_weight is not None:  # the aligned product, its extra (zero) columns sliced off
            return F.linear(x.squeeze(1), self.out_weight)[:, : dec.output_projection.out_features]
        return dec.output_layer(x).squeeze(1)

    def _self_attn(self, buf: StepBuffers, i: int, x: Tensor, mask: Tensor) -> Tensor:
        attn = self.decoder.layers[i].self_attn
        rows = x.size(0)
        weight, bias = self.qkv[i]
        qkv = F.linear(x, weight, bias).view(rows, 1, 3, attn.num_heads, attn.head_dim)
        kv = buf.kv[i]
        kv.index_copy_(1, buf.step, qkv[:, :, 1:])
        q = qkv[:, :, 0].transpose(1, 2)  # rows x H x 1 x d
        o = F.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), mask)
        return attn.out_proj(attn._merge(o))

    def _cross_attn(self, buf: StepBuffers, i: int, x: Tensor) -> Tensor:
        """The beam folded into the query axis (slots x H x beam x d), as the eager cross-attention does."""
        attn = self.decoder.layers[i].encoder_attn
        rows = x.size(0)
        q = attn.q_proj(x).view(buf.slots, buf.beam, attn.num_heads, attn.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, buf.enc_k[i], buf.enc_v[i], buf.enc_mask)
        return attn.out_proj(o.transpose(1, 2).reshape(rows, 1, attn.embed_dim))


class StaticDecoder:
    """The decoder side of one generation run on the static step: StepBuffers per (slots, src_cap, tgt_cap),
    kept across batches, and on CUDA (unless `graphs` is False) each one's step captured as a CUDA graph.

    Per batch: `start(encoder_out, slot_rows, tgt_len)`, then per step `step(tokens, step, order)`, and
    `compact(rows, slots)` when the batch shrinks to a smaller bucket. `capture_seconds` sums the captures."""

    def __init__(self, decoder: nn.Module, beam: int, graphs: bool | None = None, align: int | None = None):
        self.step_fn = StaticStep(decoder, align)
        self.beam = beam
        device = decoder.embed_tokens.weight.device
        self.graphs = device.type == "cuda" if graphs is None else graphs and device.type == "cuda"
        # keyed by (slots, source capacity, target capacity, keys' dtype)
        self.buffers: dict[tuple[int, int, int, torch.dtype], StepBuffers] = {}
        self.cuda_graphs: dict[tuple[int, int, int, torch.dtype], Any] = {}
        self.pool: Any = None
        self.capture_seconds = 0.0
        self.current: StepBuffers | None = None

    def _buffers(self, slots: int, src_cap: int, tgt_cap: int) -> StepBuffers:
        """The buffers of this shape, for the dtype the step writes now: under autocast (ROUGE validation of a
        --bf16/--fp16 run) the projections give the autocast dtype, and the keys and values are kept in it, as
        the eager decoder's cache keeps them."""
        decoder = self.step_fn.decoder
        weight = decoder.embed_tokens.weight
        autocast = torch.is_autocast_enabled(weight.device.type)
        dtype = torch.get_autocast_dtype(weight.device.type) if autocast else weight.dtype
        key = (slots, src_cap, tgt_cap, dtype)
        if key not in self.buffers:
            buf = self.buffers[key] = StepBuffers(decoder, slots, self.beam, src_cap, tgt_cap, dtype)
            # Under autocast the casts of the weights are cached per forward pass, outside the graph's pool:
            # a graph would read them after they are freed (torch's CUDA graph notes), so that step runs eagerly.
            if self.graphs and not autocast:
                self._capture(key, buf)
        return self.buffers[key]

    def _capture(self, key: tuple[int, int, int, torch.dtype], buf: StepBuffers) -> None:
        """Capture buf's step: warm-up runs on a side stream (cuBLAS handles, lazy inits, allocator state),
        then one capture into the pool every graph of this run shares. It runs on the fresh buffers (zeros,
        identity order) before any batch is loaded, so what the warm-up writes is overwritten.

        Sharing one pool is safe because graphs never run concurrently and only the graph just replayed has its
        output read: the live tensors across replays (every StepBuffers tensor) sit outside the pool, and each
        graph's output (buf.logits) stays referenced, so no later capture is given its memory."""
        torch.cuda.synchronize()
        begin = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step_fn(buf)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            buf.logits = self.step_fn(buf)
        torch.cuda.synchronize()
        self.cuda_graphs[key] = graph
        self.capture_seconds += time.perf_counter() - begin

    def start(self, encoder_out: dict[str, Tensor], slot_rows: Tensor, tgt_len: int) -> None:
        """A new batch: `slot_rows[i]` is the encoder row slot i holds; `tgt_len` the positions it may need."""
        memory, pad_mask = encoder_out["encoder_out"], encoder_out["encoder_padding_mask"]
        buf = self._buffers(
            slot_rows.numel(), bucket(memory.size(1), MIN_BUCKET), bucket(tgt_len, MIN_BUCKET)
        )
        self.step_fn.refresh()
        keys, values = self.step_fn.encoder_kv(memory)
        buf.load_encoder(keys, values, pad_mask, slot_rows)
        for kv in buf.kv:  # positions past the step are masked, but stale NaN/inf would leak through 0 * x
            kv.zero_()
        self.current = buf

    def compact(self, rows: Tensor, slots: Tensor) -> None:
        """Move to the buffers of len(slots) slots: decoder rows `rows` (their new order) and encoder `slots`
        of the current ones; the next step's order is then the identity."""
        old = self.current
        assert old is not None
        new = self._buffers(slots.numel(), old.src_cap, old.tgt_cap)
        new.take(old, rows, slots)
        self.current = new

    def step(self, tokens: Tensor, step: int, order: Tensor | None) -> Tensor:
        """Logits for the next token of each row; `tokens` are the rows' last tokens, `order` the reorder to
        apply first (None: keep the current order)."""
        buf = self.current
        assert buf is not None
        buf.tokens.copy_(tokens)
        buf.step.fill_(step)
        buf.order.copy_(buf.identity if order is None else order)
        key = (buf.slots, buf.src_cap, buf.tgt_cap, buf.dtype)
        if key in self.cuda_graphs and not torch.is_autocast_enabled(buf.tokens.device.type):
            self.cuda_graphs[key].replay()
            assert buf.logits is not None
            logits = buf.logits
        else:
            logits = self.step_fn(buf)
        return logits
