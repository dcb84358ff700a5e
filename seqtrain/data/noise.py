"""BART's noise functions (fairseq 0.12's DenoisingDataset semantics): sentence permutation, whole-word or span
masking, token permutation, insertion and rotation of one example `<s> tokens </s>`.

Each function takes the torch.Generator it draws from, and draws what fairseq's draws from torch's global
generator, in the same order and shapes: seeded alike, they return the same tensors (tests/peers). fairseq's
two numpy draws (whether to rotate, and the rotation offset) come from the same generator here. `<s>` and `</s>`
never move and are never masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

MASK_LENGTHS = ("subword", "word", "span-poisson")


def example_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator of one example's noise: a function of (seed, epoch, index) only, so the noise does not
    depend on which worker or rank reads the example, or on what was read before (exact resume)."""
    state = np.random.SeedSequence([seed % (1 << 32), epoch, index]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def poisson_span_probs(lam: float) -> torch.Tensor:
    """P(span length = k) for k = 0, 1, ... under Poisson(lam), up to the first k whose probability falls
    below 1e-7 (at most 128 values), as float32, normalized (fairseq's span distribution)."""
    ps, term = [], math.exp(-lam)
    for k in range(128):
        ps.append(term)
        term = term * lam / (k + 1)
        if ps[-1] < 1e-7:
            break
    probs = torch.tensor(ps, dtype=torch.float32)
    return probs / probs.sum(-1, keepdim=True)


def sample_spans(probs: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """`n` span lengths drawn from `probs` (what torch.distributions.Categorical(probs).sample((n,)) draws)."""
    return torch.multinomial(probs.reshape(1, -1), n, True, generator=g).reshape(n)


@dataclass
class Noise:
    """The noise settings (the task's flags) and the vocabulary facts they need."""

    mask_idx: int
    vocab_size: int  # random replacements are drawn from [1, vocab_size)
    mask: float = 0.0
    mask_random: float = 0.0
    insert: float = 0.0
    permute: float = 0.0
    rotate: float = 0.5
    permute_sentences: float = -1.0
    replace_length: int = 0
    mask_length: str = "subword"
    poisson_lambda: float = 3.0
    full_stop: int = 2  # the token that ends a sentence, for permute_sentences
    word_starts: torch.Tensor | None = None  # per vocabulary index: 1 where a word begins; None: every token

    def __post_init__(self) -> None:
        self.span_probs = (
            poisson_span_probs(self.poisson_lambda) if self.mask_length == "span-poisson" else None
        )

    def __call__(self, tokens: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """The noised source of one example (a new tensor; `tokens` is left as it was)."""
        source = tokens.clone()
        if self.permute_sentences > 0.0:
            source = permute_sentences(source, self.permute_sentences, self.full_stop, g)
        if self.mask > 0:
            source = mask_words(source, self.mask, self, g)
        if self.permute > 0.0:
            source = permute_tokens(source, self.permute, g)
        if self.insert > 0:
            source = insert_tokens(source, self.insert, self.mask_idx, self.vocab_size, self.mask_random, g)
        if self.rotate > 0.0 and float(torch.rand(1, generator=g)) < self.rotate:
            source = rotate(source, rotation_offset(len(source), g))
        return source


def permute_sentences(source: torch.Tensor, p: float, full_stop: int, g: torch.Generator) -> torch.Tensor:
    """Shuffle a share `p` of the sentences (runs of tokens ending in `full_stop`; the text before `</s>` is a
    sentence too) among themselves."""
    stops = source == full_stop
    stops[-2] = True
    ends = ((stops[1:] & ~stops[:-1]).nonzero(as_tuple=False) + 2).squeeze(1)
    n = ends.size(0)
    k = math.ceil((n * 2 * p) / 2.0)
    chosen = torch.randperm(n, generator=g)[:k]
    order = torch.arange(0, n)
    order[chosen] = chosen[torch.randperm(k, generator=g)]
    result = source.clone()
    at = 1
    for i in order.tolist():
        sentence = source[(int(ends[i - 1]) if i > 0 else 1) : int(ends[i])]
        result[at : at + sentence.size(0)] = sentence
        at += sentence.size(0)
    return result


def word_start_flags(source: torch.Tensor, word_starts: torch.Tensor | None) -> torch.Tensor:
    """1 where a word begins in `source` (int64), 0 at `<s>` and `</s>`."""
    flags = torch.ones(source.size(), dtype=torch.long) if word_starts is None else word_starts[source].long()
    flags[0] = 0
    flags[-1] = 0
    return flags


def mask_words(source: torch.Tensor, p: float, noise: Noise, g: torch.Generator) -> torch.Tensor:
    """Mask a share `p` of the words: --mask-length subword (tokens), word (whole words) or span-poisson (spans
    of words of Poisson(lambda) lengths; a length 0 becomes an inserted mask). --replace-length 1 puts one
    `<mask>` (or, with probability --mask-random, a random token) per masked word or span, 0 deletes the span,
    -1 masks every token of it."""
    is_start = word_start_flags(source, noise.word_starts)
    n_mask = int(math.ceil(is_start.float().sum() * p))
    n_inserts = 0
    if n_mask == 0:
        return source
    if noise.span_probs is not None:
        lengths = sample_spans(noise.span_probs, n_mask, g)
        total = torch.cumsum(lengths, 0)
        while total[-1] < n_mask:  # not enough mass yet: draw another n_mask spans
            lengths = torch.cat([lengths, sample_spans(noise.span_probs, n_mask, g)], dim=0)
            total = torch.cumsum(lengths, 0)
        last = int((total < n_mask).sum())  # the first span that reaches the budget, cut to fit it
        lengths[last] = n_mask - (0 if last == 0 else total[last - 1])
        lengths = lengths[: last + 1]
        kept = lengths[lengths > 0]
        n_inserts = lengths.size(0) - kept.size(0)  # zero-length spans: inserted masks instead
        lengths, n_mask = kept, kept.size(0)
        if n_mask == 0:
            return insert_tokens(
                source, n_inserts / source.size(0), noise.mask_idx, noise.vocab_size, noise.mask_random, g
            )
    else:
        lengths = torch.ones((n_mask,), dtype=torch.long)
    starts = is_start.nonzero(as_tuple=False)
    at = starts[torch.randperm(starts.size(0), generator=g)[:n_mask]].squeeze(1)
    use_random = torch.rand(n_mask, generator=g) < noise.mask_random
    keep = torch.ones(source.size(0), dtype=torch.bool)
    is_start[-1] = 255  # a word start so long that no span runs past the end of the example
    if noise.replace_length == 0:
        keep[at] = False
    else:
        _put_masks(source, at, use_random, noise, g)
    if noise.span_probs is not None:
        lengths = lengths - 1
        while at.size(0) > 0:  # extend each span word by word until its length is used up
            lengths = lengths - is_start[at + 1]
            going = lengths >= 0
            at, use_random, lengths = at[going] + 1, use_random[going], lengths[going]
            if noise.replace_length != -1:
                keep[at] = False
            else:
                _put_masks(source, at, use_random, noise, g)
    else:
        while at.size(0) > 0:  # extend each masked word to its end
            going = is_start[at + 1] == 0
            at, use_random = at[going] + 1, use_random[going]
            if noise.replace_length != -1:
                keep[at] = False
            else:
                _put_masks(source, at, use_random, noise, g)
    source = source[keep]
    if n_inserts > 0:
        source = insert_tokens(
            source, n_inserts / source.size(0), noise.mask_idx, noise.vocab_size, noise.mask_random, g
        )
    return source


def _put_masks(
    source: torch.Tensor, at: torch.Tensor, use_random: torch.Tensor, noise: Noise, g: torch.Generator
) -> None:
    source[at] = noise.mask_idx
    source[at[use_random]] = torch.randint(1, noise.vocab_size, size=(int(use_random.sum()),), generator=g)


def permute_tokens(tokens: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """Move a share `p` of the tokens between `<s>` and `</s>` to each other's places (--permute)."""
    n = len(tokens)
    k = min(math.ceil(((n * 2) * p) / 2.0), max(n - 2, 0))
    chosen = torch.randperm(n - 2, generator=g)[:k] + 1
    out = tokens.clone()
    out[chosen] = tokens[chosen[torch.randperm(k, generator=g)]]
    return out


def insert_tokens(
    tokens: torch.Tensor, p: float, mask_idx: int, vocab_size: int, random_ratio: float, g: torch.Generator
) -> torch.Tensor:
    """Insert ceil(len * p) tokens between `<s>` and `</s>`: `<mask>`, or a random token for a share
    `random_ratio` of them."""
    if p == 0.0:
        return tokens
    length = len(tokens)
    n = int(math.ceil(length * p))
    places = torch.randperm(length + n - 2, generator=g)[:n] + 1
    inserted = torch.zeros(length + n, dtype=torch.bool)
    inserted[places] = True
    result = torch.full((length + n,), -1, dtype=torch.long)
    n_random = int(math.ceil(n * random_ratio))
    result[places[n_random:]] = mask_idx
    result[places[:n_random]] = torch.randint(low=1, high=vocab_size, size=(n_random,), generator=g)
    result[~inserted] = tokens
    return result


def rotation_offset(length: int, g: torch.Generator) -> int:
    """Where a rotated example starts: uniform in [1, max(1, length - 1)]."""
    return int(torch.randint(1, max(1, length - 1) + 1, (1,), generator=g))


def rotate(tokens: torch.Tensor, offset: int) -> torch.Tensor:
    """`<s> a b c d </s>` rotated to start at `offset` (2: `<s> b c d a </s>`)."""
    return torch.cat((tokens[0:1], tokens[offset:-1], tokens[1:offset], tokens[-1:]), dim=0)
