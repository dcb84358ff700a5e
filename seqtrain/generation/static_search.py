"""The beam search loop on the static decoding step, finished on the device (`--static-decoding`).

The same search as SequenceGenerator._generate (its masks, search strategy, n-gram blocking and candidate rules
are called, not copied), with three changes that keep the host ahead of the device:

- the decoder step is seqtrain.generation.static_decoding's (fixed shapes; a CUDA graph replay on CUDA);
- finished hypotheses are kept by seqtrain.generation.device_finalize on the device, not counted on the host;
- the host reads the done mask every `check_every` steps (and at the last), and the batch shrinks only when the
  live sentences fit in half the slots (slots are a power of two; filler slots are done from the start).

A done sentence that stays in the batch finalizes nothing more, so hypotheses and scores are those of the eager
loop for the same step outputs (bitwise: tests/unit/generation/test_static_decoding.py runs this loop on the
eager step too). Sampling draws from the generator's RNG per row, so its stream depends on the batch's row
count: with a sampling strategy the loop checks every step and keeps exactly the live sentences, as the eager
loop does, and draws the same tokens.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.generation.device_finalize import DeviceFinalizer, Hypothesis
from seqtrain.generation.search import Sampling, continue_beams
from seqtrain.generation.static_decoding import StaticDecoder, bucket

CHECK_EVERY = 4  # steps between the host's looks at the done mask (the k: 4-8)


class DecoderSteps(Protocol):
    """What the loop needs of a decoder: a batch's start, one step, and a compaction."""

    def start(self, encoder_out: dict[str, Tensor], slot_rows: Tensor, tgt_len: int) -> None: ...

    def step(self, tokens: Tensor, step: int, order: Tensor | None) -> Tensor: ...

    def compact(self, rows: Tensor, slots: Tensor) -> None: ...


class StaticSteps:
    """DecoderSteps on the static step (seqtrain.generation.static_decoding.StaticDecoder)."""

    def __init__(self, model: torch.nn.Module, beam: int, graphs: bool | None = None):
        self.decoder = StaticDecoder(model.decoder, beam, graphs)

    def start(self, encoder_out: dict[str, Tensor], slot_rows: Tensor, tgt_len: int) -> None:
        self.decoder.start(encoder_out, slot_rows, tgt_len)

    def step(self, tokens: Tensor, step: int, order: Tensor | None) -> Tensor:
        return self.decoder.step(tokens[:, step], step, order)

    def compact(self, rows: Tensor, slots: Tensor) -> None:
        self.decoder.compact(rows, slots)


class EagerSteps:
    """DecoderSteps on the model's incremental decoder: this loop with the eager step, which is how the tests
    check device finalization and the deferred compaction bit for bit against the eager loop."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.state: dict[str, Any] = {}
        self.encoder_out: dict[str, Tensor] = {}

    def start(self, encoder_out: dict[str, Tensor], slot_rows: Tensor, tgt_len: int) -> None:
        self.encoder_out = self.model.encoder.reorder_encoder_out(encoder_out, slot_rows)
        self.state = {}

    def step(self, tokens: Tensor, step: int, order: Tensor | None) -> Tensor:
        if order is not None:
            self.model.decoder.reorder_incremental_state(self.state, order)
        logits, _ = self.model.decoder(tokens[:, : step + 1], self.encoder_out, incremental_state=self.state)
        return logits[:, -1, :]

    def compact(self, rows: Tensor, slots: Tensor) -> None:
        self.model.decoder.reorder_incremental_state(self.state, rows, slots)
        self.encoder_out = self.model.encoder.reorder_encoder_out(self.encoder_out, slots)


def _forced_eos_rows(gen: Any, step: int, prefix: Tensor, tokens: Tensor, scores: Tensor, lprobs: Tensor):
    """SequenceGenerator._replicate_first_beam_at_forced_eos without its host check: the gather always runs
    (an identity where no prefix forces EOS), so the step never waits for the device."""
    beam = gen.beam_size
    rows = torch.arange(tokens.size(0), device=tokens.device)
    src = torch.where(prefix[:, step].eq(gen.eos).repeat_interleave(beam), rows - rows % beam, rows)
    return tokens.index_select(0, src), scores.index_select(0, src), lprobs.index_select(0, src)


def static_generate(
    gen: Any,
    src_tokens: Tensor,
    src_lengths: Tensor | None,
    prefix_tokens: Tensor | None,
    bos: int,
    steps_impl: DecoderSteps,
    check_every: int = CHECK_EVERY,
) -> list[list[Hypothesis]]:
    """SequenceGenerator._generate's search (gen: the SequenceGenerator) on `steps_impl`; the same output."""
    beam, device = gen.beam_size, src_tokens.device
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    if src_lengths is None:
        src_lengths = src_tokens.ne(gen.pad).sum(dim=1)
    exact = isinstance(gen.search, Sampling)  # the RNG stream follows the row count (module docstring)
    if exact:
        check_every = 1
    encoder_out = gen._encode(src_tokens, src_lengths)
    max_lens = gen._max_lengths(src_tokens)
    steps = int(max_lens.max())

    n_slots = bsz if exact else bucket(bsz)
    slot_rows = torch.arange(n_slots, device=device).clamp(max=bsz - 1)  # filler slots repeat the last one
    slot_sent = torch.arange(n_slots, device=device).clamp(max=bsz)  # ... and finalize for sentence bsz
    done = slot_sent.eq(bsz)
    max_lens = max_lens.index_select(0, slot_rows)
    if prefix_tokens is not None:
        prefix_tokens = prefix_tokens.index_select(0, slot_rows)
    steps_impl.start(encoder_out, slot_rows, steps + 1)

    rows = n_slots * beam
    tokens = torch.full((rows, steps + 2), gen.pad, dtype=torch.long, device=device)
    tokens[:, 0] = bos
    scores = torch.zeros(rows, steps + 1, dtype=torch.float32, device=device)
    cands_to_ignore = torch.zeros(n_slots, beam, dtype=torch.bool, device=device)
    fin = DeviceFinalizer(
        bsz, beam, steps + 1, rows, device, gen.eos, gen.pad, gen.len_penalty, gen.normalize_scores
    )
    order: Tensor | None = None

    for step in range(steps + 1):
        last = steps_impl.step(tokens, step, order).float()
        lprobs = F.log_softmax(last if gen.temperature == 1.0 else last / gen.temperature, dim=-1)
        lprobs = gen._mask(step, lprobs, max_lens, prefix_tokens)
        if prefix_tokens is not None and step < prefix_tokens.size(1):
            tokens, scores, lprobs = _forced_eos_rows(gen, step, prefix_tokens, tokens, scores, lprobs)
        if gen.ngram_blocker is not None:
            lprobs = gen.ngram_blocker(tokens[:, : step + 1], lprobs, sink=gen.pad)

        prev = scores.view(n_slots, beam, -1)[:, :, step - 1] if step > 0 else None
        cand_scores, cand_tokens, cand_beams = gen.search.step(step, lprobs.view(n_slots, beam, -1), prev)
        cand_rows = cand_beams + torch.arange(n_slots, device=device).unsqueeze(1) * beam

        eos_mask = cand_tokens.eq(gen.eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam] &= ~cands_to_ignore
        done = fin.add(
            step, eos_mask[:, :beam], cand_rows[:, :beam], cand_scores[:, :beam], tokens, scores, slot_sent,
            done, max_lens,
        )  # fmt: skip
        if step == steps:
            break
        keep_idx = None
        if (step + 1) % check_every == 0:
            live = (~done).nonzero().squeeze(1)  # the host's look at the done mask
            n_live = live.numel()
            if n_live == 0:
                break
            target = n_live if exact else bucket(n_live)
            if target < n_slots:
                keep_idx = torch.cat([live, live[-1:].expand(target - n_live)])
                filler = torch.arange(target, device=device).ge(n_live)
                eos_mask, cand_rows = eos_mask[keep_idx], cand_rows[keep_idx]
                cand_scores, cand_tokens = cand_scores[keep_idx], cand_tokens[keep_idx]
                cands_to_ignore, max_lens = cands_to_ignore[keep_idx], max_lens[keep_idx]
                slot_sent = torch.where(filler, bsz, slot_sent[keep_idx])
                done = done[keep_idx] | filler
                if prefix_tokens is not None:
                    prefix_tokens = prefix_tokens[keep_idx]
                n_slots = target

        tokens, scores, cands_to_ignore, order = continue_beams(
            step, beam, eos_mask, cands_to_ignore, cand_rows, cand_tokens, cand_scores, tokens, scores
        )
        if keep_idx is not None:
            steps_impl.compact(order, keep_idx)
            order = None
    return fin.collect(gen.nbest)
