"""The beam search loop on the static decoding step, finished on the device (`--static-decoding`).

The same search as the eager loop (SequenceGenerator): both run one step body, decode_step.DecodeStep (its masks,
search strategy, n-gram blocking, candidates and continuation), and differ in three things that keep the host
ahead of the device here:

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

from typing import Any, Protocol

import torch
from torch import Tensor

from seqtrain.generation.decode_step import DecodeStep
from seqtrain.generation.device_finalize import DeviceFinalizer, Hypothesis
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


def static_generate(
    body: DecodeStep,
    steps_impl: DecoderSteps,
    encoder_out: dict[str, Tensor],
    src_tokens: Tensor,
    prefix_tokens: Tensor | None,
    bos: int,
    nbest: int,
    check_every: int = CHECK_EVERY,
) -> list[list[Hypothesis]]:
    """The search of `body` (SequenceGenerator.decode_step) on `steps_impl`, for the batch `src_tokens` whose
    encoder output is `encoder_out`; the eager loop's hypotheses, `nbest` per sentence."""
    beam, device = body.beam, src_tokens.device
    bsz = src_tokens.size(0)
    if bsz == 0:
        return []
    exact = body.samples  # the RNG stream follows the row count (module docstring)
    if exact:
        check_every = 1
    n_slots = bsz if exact else bucket(bsz)
    slot_rows = torch.arange(n_slots, device=device).clamp(max=bsz - 1)  # filler slots repeat the last one
    slot_sent = torch.arange(n_slots, device=device).clamp(max=bsz)  # ... and finalize for sentence bsz
    done = slot_sent.eq(bsz)
    slot_prefix = None if prefix_tokens is None else prefix_tokens.index_select(0, slot_rows)
    beams = body.begin(src_tokens.index_select(0, slot_rows), slot_prefix, bos)
    steps = beams.steps
    steps_impl.start(encoder_out, slot_rows, steps + 1)
    fin = DeviceFinalizer(bsz, beam, steps + 1, n_slots * beam, device, body.eos, body.pad, body.final_scores)
    order: Tensor | None = None

    for step in range(steps + 1):
        logits = steps_impl.step(beams.tokens, step, order)  # rows x V: the last position's
        lprobs = body.log_probs(step, logits.unsqueeze(1), beams)
        cands = body.candidates(step, lprobs, beams)
        done = fin.add(
            step, cands.eos[:, :beam], cands.rows[:, :beam], cands.scores[:, :beam], beams.tokens, beams.scores,
            slot_sent, done, beams.max_lens,
        )  # fmt: skip
        if step == steps:
            break
        keep_idx = None
        if (step + 1) % check_every == 0:
            live = [j for j, d in enumerate(done.tolist()) if not d]  # the host's look at the done mask
            if not live:
                break
            target = len(live) if exact else bucket(len(live))
            if target < n_slots:
                keep = live + live[-1:] * (target - len(live))
                keep_idx = torch.tensor(keep, dtype=torch.long, device=device)
                filler = torch.arange(target, device=device).ge(len(live))
                cands = cands.select(keep_idx)
                beams.select(keep, keep_idx)
                slot_sent = torch.where(filler, bsz, slot_sent[keep_idx])
                done = done[keep_idx] | filler
                n_slots = target

        order = body.advance(step, cands, beams)
        if keep_idx is not None:
            steps_impl.compact(order, keep_idx)
            order = None
    return fin.collect(nbest)
