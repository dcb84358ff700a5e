"""Search strategies: how the next candidates are chosen from one step's log-probabilities.

A strategy's `step` sees, for `bsz` sentences with `beam` hypotheses each, the step's (masked) log-probabilities
`lprobs` (bsz x beam x V) and the hypotheses' cumulative scores so far `prev_scores` (bsz x beam, None at step 0,
where only hypothesis 0 of each sentence is real). It returns three bsz x C tensors, best first for beam search:
cumulative candidate scores, candidate tokens, and the hypothesis (0..beam-1) each candidate extends.

Beam search returns C = 2 * beam candidates so that `beam` of them remain to continue even when the best half all
end in EOS; diverse beam search returns 2 * beam too, the groups' candidates interleaved. Sampling returns
C = beam: candidate i always extends hypothesis i (the generator keeps finished slots aside with its
`cands_to_ignore` mask, as fairseq does).

GenerationConfig is the search's settings, with fairseq's flag names and defaults (`fairseq-generate --beam 5
--lenpen 1 ...`): seqtrain-generate's and -interactive's "Generation" flags, --eval-rouge-args, a Hugging Face
generation_config.json and Summarizer.summarize(**flags) all describe one, and so do fairseq's SequenceGenerator
keywords (keyword_config); check_generation_args is the one check of them, wherever they come from. The step body
(decode_step.DecodeStep) is built from one, with the strategy it names (make_search).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from seqtrain.config import from_args, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import FLOAT_MAX, INT_MAX, Bounds, check_value

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


# ---------------------------------------------------------------------- the settings
@settings
class GenerationConfig:
    """Generation"""

    beam: int = setting(5, "beam size (default: 5)", type=int, metavar="N", bounds=Bounds(1, 10000))
    nbest: int = setting(
        1,
        "number of hypotheses to output per sentence (default: 1)",
        type=int,
        metavar="N",
        bounds=Bounds(1, 10000),
    )
    max_len_a: float = setting(
        0,
        "generate sequences of at most a*x + b tokens, x the source length (default: a=0)",
        type=float,
        metavar="N",
        bounds=Bounds(0, 1000),
    )
    max_len_b: int = setting(
        200, "see --max-len-a (default: b=200)", type=int, metavar="N", bounds=Bounds(0, 1 << 20)
    )
    min_len: int = setting(1, "minimum generation length, EOS excluded (default: 1)", type=int, metavar="N")
    match_source_len: bool = setting(False, "generations end at the source length", action="store_true")
    unnormalized: bool = setting(False, "compare unnormalized hypothesis scores", action="store_true")
    no_early_stop: bool = setting(
        False,
        "deprecated and ignored, as in fairseq (a sentence stops once it has --beam finished hypotheses)",
        action="store_true",
    )
    no_beamable_mm: bool = setting(
        False,
        "accepted for fairseq compatibility; encoder keys/values are always shared across the beam",
        action="store_true",
    )
    lenpen: float = setting(
        1.0,
        "length penalty: scores are divided by length**lenpen; <1.0 favors shorter, >1.0 longer sentences",
        type=float,
        bounds=Bounds(-1000, 1000),
    )
    unkpen: float = setting(
        0.0,
        "unknown word penalty: <0 produces more unks, >0 fewer (default: 0)",
        type=float,
        bounds=Bounds(-FLOAT_MAX, FLOAT_MAX),
    )
    prefix_size: int = setting(
        0,
        "initialize generation by the first PS target tokens",
        type=int,
        metavar="PS",
        not_in=("interactive",),
    )
    no_repeat_ngram_size: int = setting(
        0,
        "ngram blocking such that this size ngram cannot be repeated in the generation (0: off)",
        type=int,
        metavar="N",
    )
    sampling: bool = setting(False, "sample hypotheses instead of using beam search", action="store_true")
    sampling_topk: int = setting(
        -1,
        "sample from the top k most likely words (-1: all)",
        type=int,
        metavar="PS",
        bounds=Bounds(1, INT_MAX, off=-1),
    )
    sampling_topp: float = setting(
        -1.0,
        "sample from the smallest set of words whose cumulative probability mass exceeds p (-1: off)",
        type=float,
        metavar="PS",
        bounds=Bounds(0, 1, lo_open=True, off=-1),
    )
    diverse_beam_groups: int = setting(
        -1,
        "number of groups for diverse beam search (Hamming diversity; -1: plain beam search)",
        type=int,
        metavar="N",
        bounds=Bounds(1, 10000, off=-1),
    )
    diverse_beam_strength: float = setting(
        0.5,
        "diverse beam search: how much a token proposed by an earlier group costs in a later one",
        type=float,
        metavar="N",
        bounds=Bounds(-1000, 1000),
    )
    static_decoding: bool | None = setting(
        None,
        "decode with fixed-shape steps (CUDA graphs on CUDA) and finish hypotheses on the device; the same "
        "hypotheses as the eager loop (default: on for CUDA, off on the CPU)",
        action=argparse.BooleanOptionalAction,
    )
    packed_encoder: bool | None = setting(
        None,
        "run the encoder pass on the sources' real tokens only (varlen attention), not padded; the same "
        "encoder output (default: on CUDA in fp16/bf16; the compiled CPU step always packs; the eager CPU step "
        "from 20%% pads)",
        action=argparse.BooleanOptionalAction,
    )
    temperature: float = setting(
        1.0,
        "temperature for generation (default: 1.0)",
        type=float,
        metavar="N",
        bounds=Bounds(0, 1000, lo_open=True),
    )
    # not a flag of this group: --seed seeds --sampling (the front end copies it in)
    seed: int | None = None


def flag_name(dest: str) -> str:
    """How the command line (and a --config file) names a generation setting: --max-len-b."""
    return "--" + dest.replace("_", "-")


def _kinds() -> dict[str, type]:
    """Each generation flag's kind (bool for switches, int, float), from GenerationConfig's fields."""
    out: dict[str, type] = {}
    for f in fields(GenerationConfig):
        meta = f.metadata.get("flag")
        if meta is None:
            continue
        if meta.kwargs.get("action") == "store_true":
            out[f.name] = bool
        elif meta.kwargs.get("type") in (int, float):
            out[f.name] = meta.kwargs["type"]
    return out


KINDS = _kinds()


def check_generation_value(dest: str, value: Any, name: Callable[[str], str] = flag_name) -> None:
    """One generation setting: of its flag's kind (a switch takes True / False, an int flag an int, a float
    flag a number; never a string or a bool for a number) and in its range (seqtrain.flag_bounds), as
    SeqtrainError naming it by `name`."""
    kind = KINDS.get(dest)
    if kind is None:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        what = {bool: "True or False", int: "an integer", float: "a number"}[kind]
        raise SeqtrainError(f"{name(dest)} must be {what}, got {value!r}")
    try:
        check_value(dest, value)
    except argparse.ArgumentTypeError as e:
        raise SeqtrainError(f"{name(dest)} {e}") from None


def generation_config(parsed: Any) -> GenerationConfig:
    """The search settings among a parser's result (a flag it lacks, or None, keeps its default): the one
    conversion a front end makes before build_generator (seqtrain.config.from_args)."""
    return from_args(GenerationConfig, parsed)


def check_generation_args(
    config: GenerationConfig, name: Callable[[str], str] = flag_name, rerank: bool = False
) -> None:
    """The one check of generation settings, wherever they come from: the command line and --config,
    --eval-rouge-args, a Hugging Face generation_config.json, seqtrain.Summarizer.summarize(**flags). `config`
    holds the values as given (a GenerationConfig made with them as they are, so a None or a string is caught
    here; a parser's result holding its fields reads the same); `rerank`: seqtrain-generate's --rerank is on.
    Every setting's kind and range (check_generation_value), then fairseq's checks across them, as SeqtrainErrors
    naming each setting by `name` (the command line's --beam by default; a caller names its own source:
    `FOLDER/generation_config.json: num_beams`, `Summarizer.summarize(beam=...)`)."""
    values = vars(config)
    for dest in KINDS:
        if dest in values:
            check_generation_value(dest, values[dest], name)
    for dest in ("static_decoding", "packed_encoder"):  # switches with a default the device decides (None)
        if values.get(dest) not in (None, True, False):
            raise SeqtrainError(f"{name(dest)} must be True, False or None, got {values[dest]!r}")
    a = generation_config(config)
    if a.beam < 1:
        raise SeqtrainError(f"{name('beam')} must be >= 1, got {a.beam}")
    if not 1 <= a.nbest <= a.beam:
        raise SeqtrainError(f"{name('nbest')} must be between 1 and {name('beam')} ({a.beam}), got {a.nbest}")
    if a.min_len < 0:
        raise SeqtrainError(f"{name('min_len')} must be >= 0, got {a.min_len}")
    if a.max_len_b < 0 or a.max_len_a < 0:
        raise SeqtrainError(f"{name('max_len_a')} and {name('max_len_b')} must be >= 0")
    if a.min_len > 0 and a.max_len_a == 0 and a.min_len > a.max_len_b:
        raise SeqtrainError(
            f"{name('min_len')} {a.min_len} is above the maximum length {name('max_len_b')} {a.max_len_b}"
        )
    if a.prefix_size < 0:
        raise SeqtrainError(f"{name('prefix_size')} must be >= 0, got {a.prefix_size}")
    if a.no_repeat_ngram_size < 0:
        raise SeqtrainError(f"{name('no_repeat_ngram_size')} must be >= 0, got {a.no_repeat_ngram_size}")
    if a.temperature <= 0:
        raise SeqtrainError(f"{name('temperature')} must be > 0, got {a.temperature}")
    # --rerank picks --nbest of the beam's finished hypotheses, so sampling may keep fewer than --beam
    if a.sampling and a.nbest != a.beam and not rerank:
        raise SeqtrainError(f"{name('sampling')} requires {name('nbest')} to be equal to {name('beam')}")
    if a.sampling_topp != -1.0 and not 0 < a.sampling_topp <= 1:
        raise SeqtrainError(f"{name('sampling_topp')} must be in (0, 1], got {a.sampling_topp}")
    groups = a.diverse_beam_groups
    if groups > 0 and a.sampling:
        raise SeqtrainError(f"{name('diverse_beam_groups')} and {name('sampling')} cannot be used together")
    if groups > 0 and a.beam % groups:
        raise SeqtrainError(
            f"{name('beam')} {a.beam} must be a multiple of {name('diverse_beam_groups')} {groups}"
        )
    if (a.sampling_topk > 0 or a.sampling_topp > 0) and not a.sampling:
        raise SeqtrainError(f"{name('sampling_topk')}/{name('sampling_topp')} need {name('sampling')}")


# fairseq's SequenceGenerator keywords for the step's search settings -> GenerationConfig's names (normalize_scores
# is the opposite of --unnormalized)
FAIRSEQ_KEYWORDS = {
    "beam_size": "beam",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "min_len": "min_len",
    "match_source_len": "match_source_len",
    "normalize_scores": "unnormalized",
    "len_penalty": "lenpen",
    "unk_penalty": "unkpen",
    "temperature": "temperature",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
}


def keyword_config(**keywords: Any) -> GenerationConfig:
    """The search settings fairseq's SequenceGenerator keywords give (beam_size=4, len_penalty=1.5,
    normalize_scores=False, max_len_b=..., ...; the others keep seqtrain-generate's defaults), checked as the
    flags are (check_generation_args), each named by its keyword."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, value in keywords.items():
        if key not in FAIRSEQ_KEYWORDS:
            raise TypeError(f"SequenceGenerator() got an unexpected keyword argument {key!r}")
        dest = FAIRSEQ_KEYWORDS[key]
        values[dest] = (not value) if key == "normalize_scores" else value
        names[dest] = key
    config = GenerationConfig(**values)
    check_generation_args(config, lambda dest: names.get(dest, dest))
    return config


def make_search(config: GenerationConfig, device: torch.device) -> Any:
    """The search strategy `config` names: sampling (its draws seeded with config.seed, 1 when unset, on
    `device`), diverse beam search, or beam search."""
    if config.sampling:
        gen = torch.Generator(device=device)
        gen.manual_seed(1 if config.seed is None else config.seed)
        return Sampling(config.sampling_topk, config.sampling_topp, gen)
    if config.diverse_beam_groups > 0:
        return DiverseBeamSearch(config.diverse_beam_groups, config.diverse_beam_strength)
    return BeamSearch()
