"""The one step body of beam search and sampling: every per-step rule, written once for both decoding loops.

The eager loop (sequence_generator.py) and the static loop (static_search.py) differ in how they run the decoder
(incremental cache vs fixed-shape buffers), where they keep finished hypotheses (counted on the host vs on the
device) and when finished sentences leave the batch (every step vs in power-of-two buckets every few steps).
Everything else about a step is the search itself and lives here, so a per-step feature is written once:

- `begin`: a batch's search state (`Beams`): every sentence's `beam` rows at the start token, its max length
  (fairseq's rule, see `max_lengths`), its forced prefix. The host reads the max lengths and the prefix steps
  that force EOS once, here, so no step needs to look at the device for them.
- `log_probs`: the next token's log-probabilities (float32, logits / temperature; a model's own
  `next_token_log_probs` for an ensemble) with the masks: pad never, unk penalty, EOS forced at a sentence's max
  length, prefix tokens forced (a forced EOS copies the first beam into every slot, as fairseq does), EOS
  forbidden below min length, repeated n-grams blocked (on the device, ngram.py).
- `candidates`: the search strategy's proposals (search.py: top 2*beam for beam search, per group for diverse
  beam search, draws for sampling) as rows of the batch, and which of them end here (EOS, not in an ignored
  slot).
- `final_scores` (lenpen: cumulative log-prob / len**lenpen, len counting the EOS) and `positional_scores`:
  what a finished hypothesis records, whichever loop keeps it.
- `advance`: the first `beam` candidates per sentence that did not end continue (search.continue_beams); returns
  the rows the decoder's state must follow.

Nothing here copies a tensor to the host per step; a loop that drops sentences calls `Beams.select` and
`Candidates.select` with the kept sentences.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.errors import SeqtrainError
from seqtrain.generation.cpu_step import beam_candidates
from seqtrain.generation.ngram import NGramRepeatBlocker
from seqtrain.generation.search import BeamSearch, GenerationConfig, Sampling, continue_beams, make_search

LogProbs = Callable[[Tensor, float], Tensor]


def last_log_probs(logits: Tensor, temperature: float) -> Tensor:
    """The next token's log-probabilities (float32) from the decoder's logits (B x T x V) at the last position."""
    last = logits[:, -1, :].float()
    return F.log_softmax(last if temperature == 1.0 else last / temperature, dim=-1)


def positional_scores(cum: Tensor) -> Tensor:
    """Per-token log-probabilities from cumulative scores (k x n): the first, then the differences."""
    return torch.cat([cum[:, :1], cum[:, 1:] - cum[:, :-1]], dim=1)


@dataclass
class Beams:
    """The search state of the sentences in a batch, `beam` decoder rows each (row = sentence * beam + hyp).

    Row tensors (`tokens`, `scores`) follow the candidates each step (`DecodeStep.advance`); sentence tensors
    (`cands_to_ignore`, `max_lens`, `prefix`) and the host's copy of the max lengths follow `select`."""

    tokens: Tensor  # rows x (steps + 2): the start token, the chosen tokens, pad after
    scores: Tensor  # rows x (steps + 1): cumulative log-probabilities
    cands_to_ignore: Tensor  # sentences x beam: slots that finished (sampling keeps them aside)
    max_lens: Tensor  # sentences: the most tokens before the final EOS
    prefix: Tensor | None  # sentences x P: tokens to force (pad = not forced)
    max_lens_host: list[int]  # max_lens on the host
    eos_forced: frozenset[int]  # the steps at which some sentence's prefix forces EOS
    steps: int  # the last step of the batch: max(max_lens) at the start

    def __post_init__(self) -> None:
        self.shortest = min(self.max_lens_host)  # no sentence is at its max length before this step

    def select(self, keep: list[int], index: Tensor) -> None:
        """Keep the sentences `keep` (`index`: the same on the device), in that order; rows follow in `advance`."""
        self.cands_to_ignore, self.max_lens = self.cands_to_ignore[index], self.max_lens[index]
        if self.prefix is not None:
            self.prefix = self.prefix[index]
        self.max_lens_host = [self.max_lens_host[j] for j in keep]
        self.shortest = min(self.max_lens_host)


@dataclass
class Candidates:
    """One step's candidates, sentences x C, best first: cumulative scores, tokens, the rows they extend, and
    which of them end the hypothesis here (EOS with a finite score, not in an ignored slot)."""

    scores: Tensor
    tokens: Tensor
    rows: Tensor
    eos: Tensor

    def select(self, index: Tensor) -> Candidates:
        return Candidates(self.scores[index], self.tokens[index], self.rows[index], self.eos[index])


class DecodeStep:
    """The per-step rules of one generator's search (see the module docstring), built from its settings: the
    search settings (search.GenerationConfig; beam, lengths, penalties, temperature, n-gram blocking), checked
    where they came from (check_generation_args), and the model's and dictionary's facts.

    `max_len` caps every sentence's output length (tokens before the final EOS: max_len - 1 at most; the model's
    positions); `search` is the strategy (default: the one `config` names, search.make_search, on the CPU);
    `log_probs(logits, temperature)` turns the decoder's output into the next token's log-probabilities
    (default: `last_log_probs`)."""

    def __init__(
        self,
        config: GenerationConfig,
        pad: int,
        unk: int,
        eos: int,
        *,
        max_len: int,
        search: Any = None,
        log_probs: LogProbs | None = None,
    ):
        if config.max_len_a == 0 and not config.match_source_len and config.min_len > max_len - 1:
            # (--min-len against --max-len-b is the settings' own check; this one is against the model)
            raise SeqtrainError(f"--min-len {config.min_len} is larger than the max length {max_len - 1}")
        self.pad, self.unk, self.eos, self.beam = pad, unk, eos, config.beam
        self.max_len, self.max_len_a, self.max_len_b = max_len, config.max_len_a, config.max_len_b
        self.min_len = config.min_len
        self.match_source_len = config.match_source_len
        self.normalize_scores = not config.unnormalized
        self.len_penalty = config.lenpen
        self.unk_penalty = config.unkpen
        self.temperature = config.temperature
        n = config.no_repeat_ngram_size
        self.ngram_blocker = NGramRepeatBlocker(n) if n > 0 else None
        self.search = search if search is not None else make_search(config, torch.device("cpu"))
        self._log_probs = log_probs or last_log_probs

    @property
    def samples(self) -> bool:
        """Whether the strategy draws from an RNG, per row: its stream then depends on the batch's row count."""
        return isinstance(self.search, Sampling)

    # ------------------------------------------------------------------ per batch

    def max_lengths(self, src_tokens: Tensor) -> Tensor:
        """Per-sentence max output length (tokens before the final EOS). --match-source-len: the source's length
        without pads and EOS (fairseq's src_lengths; it then scores longer hypotheses -inf, here they cannot occur)."""
        if self.match_source_len:
            return (src_tokens.ne(self.pad) & src_tokens.ne(self.eos)).sum(dim=1)
        src_len = src_tokens.ne(self.pad).sum(dim=1).double()
        lens = torch.floor(self.max_len_a * src_len + self.max_len_b).long()
        return lens.clamp(min=0, max=self.max_len - 1)

    def begin(self, src_tokens: Tensor, prefix: Tensor | None, bos: int) -> Beams:
        """The search state of a batch of sources (B x S; prefix: B x P or None), decoding from `bos`. One host
        read: the max lengths and the prefix steps that force EOS."""
        n, beam, device = src_tokens.size(0), self.beam, src_tokens.device
        max_lens = self.max_lengths(src_tokens)
        host = max_lens if prefix is None else torch.cat([max_lens, prefix.eq(self.eos).any(dim=0).long()])
        values: list[int] = host.tolist()
        eos_forced = frozenset(s for s, forced in enumerate(values[n:]) if forced)
        steps = max(values[:n])
        tokens = torch.full((n * beam, steps + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = bos
        scores = torch.zeros(n * beam, steps + 1, dtype=torch.float32, device=device)
        cands_to_ignore = torch.zeros(n, beam, dtype=torch.bool, device=device)
        return Beams(tokens, scores, cands_to_ignore, max_lens, prefix, values[:n], eos_forced, steps)

    # ------------------------------------------------------------------ per step

    def log_probs(self, step: int, logits: Tensor, beams: Beams) -> Tensor:
        """The masked log-probabilities (rows x V) of step `step` from the decoder's output (rows x T x ...,
        its last position used). A forced EOS may replace `beams.tokens` and `beams.scores` (first beam copied)."""
        lprobs = self._log_probs(logits, self.temperature)
        lprobs = self._mask(step, lprobs, beams, any_at_max=step >= beams.shortest)
        if step in beams.eos_forced:
            lprobs = self._copy_first_beam_at_forced_eos(step, beams, lprobs)
        if self.ngram_blocker is not None:  # pad is -inf already: the blocker's sink column
            lprobs = self.ngram_blocker(beams.tokens[:, : step + 1], lprobs, sink=self.pad)
        return lprobs

    def candidates(self, step: int, lprobs: Tensor, beams: Beams) -> Candidates:
        """The search strategy's candidates for every sentence, as rows of the batch, and which end here."""
        n, beam = beams.cands_to_ignore.size(0), self.beam
        prev = beams.scores.view(n, beam, -1)[:, :, step - 1] if step > 0 else None
        cand_scores, cand_tokens, cand_beams = self.search.step(step, lprobs.view(n, beam, -1), prev)
        return self._as_candidates(cand_scores, cand_tokens, cand_beams, beams)

    def _as_candidates(self, scores: Tensor, tokens: Tensor, hyps: Tensor, beams: Beams) -> Candidates:
        n, beam = beams.cands_to_ignore.size(0), self.beam
        rows = hyps + torch.arange(n, device=tokens.device).unsqueeze(1) * beam
        eos = tokens.eq(self.eos) & scores.ne(-math.inf)
        eos[:, :beam] &= ~beams.cands_to_ignore
        return Candidates(scores, tokens, rows, eos)

    def fusable(self, beams: Beams) -> bool:
        """Whether `fused_candidates` can take this batch's steps: plain beam search of one model's logits, no
        forced prefix."""
        return (
            type(self.search) is BeamSearch
            and self._log_probs is last_log_probs
            and beams.prefix is None
            and not beams.eos_forced
        )

    def fused_candidates(
        self, step: int, logits: Tensor, beams: Beams, unexpanded: bool
    ) -> Candidates | None:
        """`log_probs` then `candidates` in one pass per row (cpu_step.beam_candidates; the same candidates, the
        scores to rounding), from the decoder's last-position logits (rows x V; one row per sentence when
        `unexpanded`, step 0). None where the compiled step is unavailable or a logit is not finite: the caller
        takes the two-step path."""
        beam = self.beam
        tokens = beams.tokens
        if step == 0 and not unexpanded:  # beam search extends only the first of a sentence's identical rows
            logits, tokens, unexpanded = logits[::beam], tokens[::beam], True
        elif unexpanded:
            tokens = tokens[::beam]
        vocab = logits.size(-1)
        k = min(2 * beam, (vocab if step == 0 else beam * vocab) - 1)
        prev = None if step == 0 else beams.scores[:, step - 1]
        out = beam_candidates(
            logits,
            prev,
            k,
            self.temperature,
            self.pad,
            self.unk,
            self.unk_penalty,
            self.eos,
            step < self.min_len,
            beams.max_lens.le(step),
            tokens[:, : step + 1],
            0 if self.ngram_blocker is None else self.ngram_blocker.n,
        )
        if out is None:
            return None
        return self._as_candidates(*out, beams)

    def advance(self, step: int, cands: Candidates, beams: Beams) -> Tensor:
        """Continue the first `beam` candidates per sentence that did not end; returns the rows (of the batch
        the candidates index) that the next step's rows come from."""
        beams.tokens, beams.scores, beams.cands_to_ignore, rows = continue_beams(
            step, self.beam, cands.eos, beams.cands_to_ignore, cands.rows, cands.tokens, cands.scores,
            beams.tokens, beams.scores,
        )  # fmt: skip
        return rows

    def final_scores(self, step: int, eos_scores: Tensor) -> Tensor:
        """The score of hypotheses ending at `step` (step + 1 tokens with their EOS): length-normalized unless
        --unnormalized."""
        return eos_scores / ((step + 1) ** self.len_penalty) if self.normalize_scores else eos_scores

    # ------------------------------------------------------------------ the masks

    def _mask(self, step: int, lprobs: Tensor, beams: Beams, any_at_max: bool) -> Tensor:
        """`any_at_max` False (no sentence is at its max length) skips the forced-EOS pass."""
        beam, eos = self.beam, self.eos
        lprobs = torch.nan_to_num_(lprobs, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        lprobs[:, self.pad] = -math.inf
        if self.unk_penalty:
            lprobs[:, self.unk] -= self.unk_penalty
        at_max = (step >= beams.max_lens).repeat_interleave(beam)  # per decoder row
        if any_at_max:
            not_eos = torch.ones(lprobs.size(1), dtype=torch.bool, device=lprobs.device)
            not_eos[eos] = False
            lprobs = lprobs.masked_fill(at_max.unsqueeze(1) & not_eos, -math.inf)
        free = ~at_max
        prefix = beams.prefix
        if prefix is not None and step < prefix.size(1):
            forced_tok = prefix[:, step].repeat_interleave(beam)
            forced = forced_tok.ne(self.pad) & free
            kept = lprobs.gather(1, forced_tok.unsqueeze(1))
            only_forced = torch.full_like(lprobs, -math.inf).scatter(1, forced_tok.unsqueeze(1), kept)
            lprobs = torch.where(forced.unsqueeze(1), only_forced, lprobs)
            free = free & ~forced
        if step < self.min_len:
            lprobs[:, eos] = torch.where(free, torch.full_like(lprobs[:, eos], -math.inf), lprobs[:, eos])
        return lprobs

    def _copy_first_beam_at_forced_eos(self, step: int, beams: Beams, lprobs: Tensor) -> Tensor:
        """A prefix that contains EOS finishes the hypothesis; give every beam slot of those sentences the first
        beam's state so the sentence collects `beam` (identical) finalized hypotheses, as fairseq does. Other
        sentences' rows are gathered from themselves (`begin` told the host this step has such a prefix)."""
        beam = self.beam
        assert beams.prefix is not None
        rows = torch.arange(beams.tokens.size(0), device=lprobs.device)
        eos_sent = beams.prefix[:, step].eq(self.eos).repeat_interleave(beam)
        src = torch.where(eos_sent, rows - rows % beam, rows)
        beams.tokens, beams.scores = beams.tokens.index_select(0, src), beams.scores.index_select(0, src)
        return lprobs.index_select(0, src)
