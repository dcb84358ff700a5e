"""Finished hypotheses kept on the device: beam search's finalization without a host sync per step.

The eager loop (sequence_generator.py) copies each step's EOS mask to the host to count, per sentence, the
hypotheses that have ended, so the host cannot queue step t+1 while the device runs step t. Here the counts
and the finished hypotheses live in device buffers indexed by sentence and finishing slot. Per step the EOS
candidates among a sentence's top `beam` (candidate order) are numbered with a cumulative sum after the
sentence's count, and those numbered below `beam` are written to their slot: fairseq's rule (the first `beam`
finished per sentence are kept) without leaving the device. Candidates not kept are written to scratch rows
(one per candidate, so no two writes meet), which keeps every shape fixed.

A sentence is done once it has `beam` finished hypotheses or reaches its max length; `add` returns that mask
and the caller reads it every few steps. A done sentence may decode a few more steps; it finalizes nothing
more. Slot order within a sentence is finalization order, so `collect` sorts exactly as the eager loop does:
the same hypotheses and scores, bit for bit, for the same step outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from seqtrain.generation.decode_step import positional_scores

Hypothesis = dict[str, Any]


class DeviceFinalizer:
    def __init__(
        self,
        bsz: int,
        beam: int,
        width: int,
        max_rows: int,
        device: torch.device,
        eos: int,
        pad: int,
        final_scores: Callable[[int, Tensor], Tensor],
    ):
        """`width`: the longest hypothesis (tokens with its EOS); `max_rows`: the most decoder rows a step has
        (the scratch rows); `final_scores(step, eos_scores)`: the step body's (DecodeStep.final_scores). Sentence
        `bsz` is the filler slots' sentence: it never finalizes."""
        self.bsz, self.beam, self.width = bsz, beam, width
        self.eos, self.pad = eos, pad
        self.final_scores = final_scores
        n = bsz * beam + max_rows
        self.counts = torch.zeros(bsz + 1, dtype=torch.long, device=device)
        self.tokens = torch.full((n, width), pad, dtype=torch.long, device=device)
        self.positional = torch.zeros(n, width, dtype=torch.float32, device=device)
        self.final = torch.zeros(n, dtype=torch.float32, device=device)
        self.lengths = torch.zeros(n, dtype=torch.long, device=device)
        self.cols = torch.arange(width, device=device)
        self.scratch = torch.arange(max_rows, device=device) + bsz * beam

    def add(
        self,
        step: int,
        eos_top: Tensor,
        rows_top: Tensor,
        scores_top: Tensor,
        tokens: Tensor,
        scores: Tensor,
        slot_sent: Tensor,
        done: Tensor,
        max_lens: Tensor,
    ) -> Tensor:
        """Finalize this step's EOS candidates among the top `beam` (eos_top, rows_top, scores_top: slots x
        beam; rows index `tokens` / `scores`, the rows' token and cumulative-score buffers) of the slots not
        `done`; `slot_sent` maps slots to sentences. Returns the new done mask (slots)."""
        beam = self.beam
        eligible = eos_top & ~done.unsqueeze(1)
        number = eligible.long().cumsum(1) - 1 + self.counts.index_select(0, slot_sent).unsqueeze(1)
        chosen = eligible & number.lt(beam)
        flat = chosen.view(-1)
        n = flat.numel()
        dest = torch.where(flat, (slot_sent.unsqueeze(1) * beam + number).view(-1), self.scratch[:n])

        rows = rows_top.reshape(-1)
        eos_scores = scores_top.reshape(-1)
        w = self.width
        hyp = tokens.index_select(0, rows)[:, 1 : w + 1]
        hyp = torch.where(self.cols.eq(step), self.eos, torch.where(self.cols.lt(step), hyp, self.pad))
        cum = scores.index_select(0, rows)[:, :w]
        cum = torch.where(self.cols.eq(step), eos_scores.unsqueeze(1), cum)
        positional = torch.where(self.cols.le(step), positional_scores(cum), 0.0)
        final = self.final_scores(step, eos_scores)
        self.tokens.index_copy_(0, dest, hyp)
        self.positional.index_copy_(0, dest, positional)
        self.final.index_copy_(0, dest, final)
        self.lengths.index_fill_(0, dest, step + 1)
        self.counts.index_add_(0, slot_sent, chosen.sum(1))
        return done | self.counts.index_select(0, slot_sent).ge(beam) | max_lens.le(step)

    def collect(self, nbest: int) -> list[list[Hypothesis]]:
        """Per sentence its finished hypotheses best first (a stable sort: ties keep finalization order, as the
        eager loop), nbest kept; one transfer to the host."""
        k = self.bsz * self.beam
        counts = self.counts[: self.bsz].tolist()
        tokens, positional, final = self.tokens[:k].cpu(), self.positional[:k].cpu(), self.final[:k].cpu()
        lengths = self.lengths[:k].tolist()
        out = []
        for sent, count in enumerate(counts):
            hypos = []
            for slot in range(sent * self.beam, sent * self.beam + count):
                length = lengths[slot]
                hypo = {
                    "tokens": tokens[slot, :length].clone(),
                    "score": final[slot].clone(),
                    "attention": None,
                    "alignment": None,
                    "positional_scores": positional[slot, :length].clone(),
                }
                hypos.append((float(final[slot]), hypo))
            hypos.sort(key=lambda h: h[0], reverse=True)
            out.append([h for _, h in hypos[:nbest]])
        return out
