"""No-repeat n-gram blocking (`--no-repeat-ngram-size N`), vectorized on the tokens' device.

At each step a hypothesis may not emit a token that would complete an n-gram it already contains. The blocker
compares the last n-1 tokens of every hypothesis with every earlier (n-1)-token window at once (one `unfold`,
one equality test) and masks the tokens that followed the matching windows. Nothing is copied to the host, so the
decoding loop never waits on the device for it.

The compared prefix includes the decoder's start token (as fairseq's CUDA kernel and transformers do); with
n = 1 only generated tokens are blocked, since blocking the start token (EOS) would forbid ending a hypothesis.
fairseq 0.12's CPU fallback blocks nothing (it reads the pad-filled tail of its token buffer); seqtrain blocks on
every device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class NGramRepeatBlocker:
    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"n-gram size must be >= 1, got {n}")
        self.n = n

    def __call__(self, tokens: Tensor, lprobs: Tensor, sink: int | None = None) -> Tensor:
        """tokens: R x t (start token first, then the generated prefix); lprobs: R x V, masked in place.
        `sink`: a column that is -inf in every row already (the generator's pad); lets the blocker write -inf
        straight into lprobs instead of building an R x V mask."""
        n, t = self.n, tokens.size(1)
        if n == 1:
            if t > 1:
                lprobs.scatter_(1, tokens[:, 1:], -math.inf)
            return lprobs
        if t < n:  # no complete n-gram yet
            return lprobs
        num = t - n + 1  # windows that have a following token
        windows = tokens.unfold(1, n - 1, 1)[:, :num]  # R x num x (n-1)
        last = tokens[:, t - n + 1 :]  # R x (n-1)
        match = windows.eq(last.unsqueeze(1)).all(dim=2)  # R x num
        following = tokens[:, n - 1 :]  # R x num: the token after each window
        # Unmatched windows write into a spare column, so one scatter handles every row without a host sync.
        if sink is not None:
            index = torch.where(match, following, following.new_full((), sink))
            return lprobs.scatter_(1, index, -math.inf)
        vocab = lprobs.size(1)
        sink = following.new_full((), vocab)
        index = torch.where(match, following, sink)
        banned = torch.zeros(lprobs.size(0), vocab + 1, dtype=torch.bool, device=lprobs.device)
        banned.scatter_(1, index, True)
        return lprobs.masked_fill_(banned[:, :vocab], -math.inf)


def has_repeated_ngram(tokens: list, n: int) -> bool:
    """True if the token list contains some n-gram twice (used to check outputs in tests and tools)."""
    seen = set()
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False
