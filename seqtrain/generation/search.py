"""Search strategies: how the next candidates are chosen from one step's log-probabilities.

A strategy's `step` sees, for `bsz` sentences with `beam` hypotheses each, the step's (masked) log-probabilities
`lprobs` (bsz x beam x V) and the hypotheses' cumulative scores so far `prev_scores` (bsz x beam, None at step 0,
where only hypothesis 0 of each sentence is real). It returns three bsz x C tensors, best first for beam search:
cumulative candidate scores, candidate tokens, and the hypothesis (0..beam-1) each candidate extends.

Beam search returns C = 2 * beam candidates so that `beam` of them remain to continue even when the best half all
end in EOS; diverse beam search returns 2 * beam too, the groups' candidates interleaved. Sampling returns
C = beam: candidate i always extends hypothesis i (the generator keeps finished slots aside with its
`cands_to_ignore` mask, as fairseq does).
"""

from __future__ import annotations

import torch
from torch import Tensor

Candidates = tuple[Tensor, Tensor, Tensor]


class BeamSearch:
    """fairseq's beam search: top 2*beam continuations over all beam x vocab extensions of a sentence."""

    def step(self, step: int, lprobs: Tensor, prev_scores: Tensor | None) -> Candidates:
        bsz, beam, vocab = lprobs.shape
        if step == 0:
            # all hypotheses are identical at the start: extend only the first so candidates are distinct
            flat = lprobs[:, 0, :]
        else:
            flat = (lprobs + prev_scores.unsqueeze(-1)).view(bsz, beam * vocab)
        # fairseq keeps one fewer than all entries so that pad (always -inf) is never needed to fill the list
        k = min(2 * beam, flat.size(1) - 1)
        scores, index = torch.topk(flat, k, dim=1)
        return scores, index % vocab, torch.div(index, vocab, rounding_mode="floor")


class DiverseBeamSearch:
    """Diverse beam search with Hamming diversity (Vijayakumar et al., 2016, "Diverse Beam Search"), as fairseq
    0.12.2's DiverseBeamSearch.

    The beam is split into `num_groups` groups; hypothesis h belongs to group h % num_groups. The groups take
    their beam-search step one after the other, and each token a group proposes this step lowers that token's
    log-probability by `strength` in every later group (once per proposing candidate), which pushes the groups
    apart. Each group proposes 2 x (beam / num_groups) candidates; they are interleaved (slot 0 of every group,
    then slot 1, ...), and the generator finalizes and continues from them as from beam search's.

    fairseq's later main branch (packaged as fairseq 0.12.3) made the penalty cumulative over steps by default
    and keeps that state in a table indexed by example id, which fails once an id exceeds the batch size; the
    penalty here has no state across steps, so no table exists and every batch works (that fix, and the
    Hamming rule, are its diversity_discount=0, candidate_multiple=2 setting, which this equals).
    """

    def __init__(self, num_groups: int, strength: float):
        self.num_groups = num_groups
        self.strength = strength
        self.beam = BeamSearch()

    def step(self, step: int, lprobs: Tensor, prev_scores: Tensor | None) -> Candidates:
        bsz, beam, vocab = lprobs.shape
        groups = self.num_groups
        penalty = torch.zeros(bsz, vocab, dtype=lprobs.dtype, device=lprobs.device)
        scores_g, tokens_g, beams_g = [], [], []
        for g in range(groups):
            lprobs_g = lprobs[:, g::groups, :]
            if g > 0:  # the same float operation as fairseq's torch.add(..., alpha=-strength)
                lprobs_g = torch.add(lprobs_g, penalty.unsqueeze(1), alpha=-self.strength)
            prev_g = prev_scores[:, g::groups] if prev_scores is not None else None
            scores, tokens, beams = self.beam.step(step, lprobs_g, prev_g)
            scores_g.append(scores)
            tokens_g.append(tokens)
            beams_g.append(beams * groups + g)
            penalty.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=penalty.dtype))
        return (
            torch.stack(scores_g, dim=2).view(bsz, -1),
            torch.stack(tokens_g, dim=2).view(bsz, -1),
            torch.stack(beams_g, dim=2).view(bsz, -1),
        )


class Sampling:
    """Sample one continuation per hypothesis (at step 0, `beam` draws from the first hypothesis).

    `topk` > 0 keeps the k most likely tokens; `topp` > 0 keeps the smallest set of most likely tokens whose
    probability reaches p (it takes precedence over topk, as in fairseq). Scores are the unrenormalized
    log-probabilities of the drawn tokens (temperature already applied by the generator). Draws use `generator`
    so a seed reproduces them.
    """

    def __init__(self, topk: int = -1, topp: float = -1.0, generator: torch.Generator | None = None):
        self.topk = topk
        self.topp = topp
        self.generator = generator

    def _restrict(self, lprobs: Tensor) -> tuple[Tensor, Tensor | None]:
        """Returns (log-probs of the allowed tokens, their vocabulary ids or None when it is the whole vocab)."""
        if self.topp > 0:
            probs = lprobs.exp()
            sorted_probs, ids = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            keep = mass_before < self.topp  # includes the token that crosses p
            # full width (no truncation to the widest kept set): that would need a host sync every step
            kept_lprobs = lprobs.gather(-1, ids).masked_fill(~keep, float("-inf"))
            return kept_lprobs, ids
        if self.topk > 0:
            values, ids = lprobs.topk(min(self.topk, lprobs.size(-1)), dim=-1)
            return values, ids
        return lprobs, None

    def step(self, step: int, lprobs: Tensor, prev_scores: Tensor | None) -> Candidates:
        bsz, beam, vocab = lprobs.shape
        if step == 0:
            lprobs = lprobs[:, :1, :]
        allowed, ids = self._restrict(lprobs)
        probs = allowed.exp().view(-1, allowed.size(-1))
        if step == 0:
            draws = torch.multinomial(probs, beam, replacement=True, generator=self.generator).view(
                bsz, 1, beam
            )
            draws = draws.transpose(1, 2)  # bsz x beam x 1, every draw from hypothesis 0
            source = allowed.expand(bsz, beam, allowed.size(-1))
            ids = ids.expand(bsz, beam, ids.size(-1)) if ids is not None else None
        else:
            draws = torch.multinomial(probs, 1, replacement=True, generator=self.generator).view(bsz, beam, 1)
            source = allowed
        scores = source.gather(-1, draws).squeeze(-1)
        tokens = (ids.gather(-1, draws) if ids is not None else draws).squeeze(-1)
        if step == 0:
            beams = torch.zeros_like(tokens)
        else:
            scores = scores + prev_scores
            beams = torch.arange(beam, device=tokens.device).expand(bsz, beam)
        return scores, tokens, beams


def continue_beams(
    step: int,
    beam: int,
    eos_mask: Tensor,
    cands_to_ignore: Tensor,
    cand_rows: Tensor,
    cand_tokens: Tensor,
    cand_scores: Tensor,
    tokens: Tensor,
    scores: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The beams of the next step (fairseq's rule, shared with the static path): per sentence the first `beam`
    candidates that neither ended (EOS) nor sit in an ignored slot continue; their rows' tokens and scores are
    gathered and extended. Returns (tokens, scores, cands_to_ignore, rows)."""
    cand_size = cand_scores.size(1)
    eos_mask[:, :beam] |= cands_to_ignore
    rank = eos_mask.long() * cand_size + torch.arange(cand_size, device=eos_mask.device)
    new_rank, chosen = torch.topk(rank, k=beam, dim=1, largest=False)
    rows = cand_rows.gather(1, chosen).view(-1)
    tokens = tokens.index_select(0, rows)
    tokens[:, step + 1] = cand_tokens.gather(1, chosen).view(-1)
    scores = scores.index_select(0, rows)
    scores[:, step] = cand_scores.gather(1, chosen).view(-1)
    return tokens, scores, new_rank.ge(cand_size), rows
