"""The noise functions' statistics over many examples (seqtrain/data/noise.py): mask counts and rates, span
lengths against Poisson(lambda), permutation and rotation rates, insertion counts, whole words, and the
per-example generator. (Equality with fairseq's own functions on the same draws: tests/peers.)"""

from __future__ import annotations

import math
from collections import Counter

import torch

from seqtrain.data import noise as N

V = 100  # vocabulary: 4 specials, words 4..98, <mask> = 99
MASK = 99


def example(g: torch.Generator, n: int) -> torch.Tensor:
    return torch.cat([torch.tensor([0]), torch.randint(4, MASK, (n,), generator=g), torch.tensor([2])])


def budget(n: int, p: float) -> int:
    """How many words fairseq (and seqtrain) mask: ceil of float32(n) * p, so 50 * 0.3 is 16, not 15."""
    return math.ceil(float(torch.tensor(float(n)) * p))


def noise(**kw) -> N.Noise:
    return N.Noise(mask_idx=MASK, vocab_size=V, rotate=0.0, **kw)


def test_subword_mask_count_is_ceil_of_the_rate_and_random_share_matches():
    g = torch.Generator().manual_seed(0)
    nz = noise(mask=0.3, mask_random=0.2, replace_length=1)
    masks = randoms = total = 0
    for _ in range(2000):
        x = example(g, 50)
        y = N.mask_words(x.clone(), 0.3, nz, g)
        changed = y != x
        assert len(y) == len(x) and y[0] == 0 and y[-1] == 2
        assert int(changed.sum()) <= budget(50, 0.3) == 16
        masks += int((y == MASK).sum())
        randoms += int((changed & (y != MASK)).sum())
        total += budget(50, 0.3)
    # 16 tokens chosen per example; 20% of them become a random token (which may equal the original)
    assert abs(masks / total - 0.8) < 0.01
    assert abs(randoms / total - 0.2 * (1 - 1 / 95)) < 0.01


def test_replace_length_0_deletes_exactly_the_chosen_tokens():
    g = torch.Generator().manual_seed(1)
    nz = noise(mask=0.25, replace_length=0)
    for _ in range(300):
        x = example(g, 40)
        y = N.mask_words(x.clone(), 0.25, nz, g)
        assert len(y) == len(x) - budget(40, 0.25)
        assert MASK not in y.tolist() and y[0] == 0 and y[-1] == 2


def test_span_lengths_follow_poisson_lambda():
    lam = 3.0
    probs = N.poisson_span_probs(lam)
    assert abs(float(probs.sum()) - 1) < 1e-6 and len(probs) == 18  # k = 0..17: P(17) is the first < 1e-7
    g = torch.Generator().manual_seed(2)
    draws = N.sample_spans(probs, 200_000, g)
    hist = Counter(draws.tolist())
    for k in range(9):
        p = math.exp(-lam) * lam**k / math.factorial(k)
        expected = 200_000 * p
        assert abs(hist[k] - expected) < 4 * math.sqrt(expected), (k, hist[k], expected)
    assert abs(float(draws.float().mean()) - lam) < 0.02


def test_span_poisson_masks_the_budget_in_spans_of_poisson_length():
    # replace_length -1: every token of a span becomes <mask>; a span of length 0 is an inserted <mask>.
    # Spans can touch or overlap, so the masked count is at most the budget, and close to it on average.
    g = torch.Generator().manual_seed(3)
    nz = noise(mask=0.3, replace_length=-1, mask_length="span-poisson", poisson_lambda=3.0)
    ratios, runs = [], Counter()
    for _ in range(1000):
        x = example(g, 100)
        y = N.mask_words(x.clone(), 0.3, nz, g)
        masked = int((y == MASK).sum())
        assert masked <= budget(100, 0.3) + (len(y) - len(x))  # inserted masks lengthen the example
        ratios.append(masked / budget(100, 0.3))
        run = 0
        for t in y.tolist() + [0]:
            if t == MASK:
                run += 1
            elif run:
                runs[run] += 1
                run = 0
    assert 0.85 < sum(ratios) / len(ratios) <= 1.0
    # masked runs: spans of mean about lambda (merged neighbours make some longer; 0-length spans are 1 token)
    mean_run = sum(k * n for k, n in runs.items()) / sum(runs.values())
    assert 3.0 < mean_run < 4.5


def test_whole_word_masks_cover_whole_words():
    g = torch.Generator().manual_seed(4)
    starts = torch.zeros(V, dtype=torch.long)
    starts[:4] = 1
    starts[4:50] = 1  # symbols 4..49 begin words, 50..98 continue them
    nz = noise(mask=0.3, replace_length=-1, mask_length="word", word_starts=starts)
    for _ in range(300):
        x = example(g, 60)
        y = N.mask_words(x.clone(), 0.3, nz, g)
        assert len(y) == len(x)
        masked = (y == MASK).tolist()
        is_start = starts[x].tolist()
        is_start[-1] = 1
        for i in range(1, len(x) - 1):
            if masked[i] and not is_start[i]:
                assert masked[i - 1], "a mask that begins inside a word"
            if masked[i] and not is_start[i + 1]:
                assert masked[i + 1], "a mask that ends inside a word"
        n_words = sum(is_start[1:-1])
        assert sum(m and s for m, s in zip(masked, is_start)) == budget(n_words, 0.3)


def test_insertion_adds_ceil_of_the_rate_with_the_random_share():
    g = torch.Generator().manual_seed(5)
    for _ in range(300):
        x = example(g, 30)
        y = N.insert_tokens(x, 0.2, MASK, V, 0.5, g)
        n = math.ceil(32 * 0.2)
        assert len(y) == len(x) + n and y[0] == 0 and y[-1] == 2
        # the random tokens are drawn from the whole vocabulary, <mask> included
        assert int((y == MASK).sum()) >= n - math.ceil(n * 0.5)


def sentences(g: torch.Generator, k: int) -> torch.Tensor:
    body = []
    for s in range(k):
        body += [10 + s] * 3 + [7]  # sentence s: three tokens 10+s and the full stop 7
    return torch.tensor([0, *body, 2])


def test_sentence_permutation_rate_and_content():
    g = torch.Generator().manual_seed(6)
    moved = total = 0
    for _ in range(2000):
        x = sentences(g, 10)
        y = N.permute_sentences(x, 0.5, 7, g)
        assert sorted(y.tolist()) == sorted(x.tolist()) and y[0] == 0 and y[-1] == 2
        order = [int(y[1 + 4 * i]) - 10 for i in range(10)]
        assert sorted(order) == list(range(10))
        moved += sum(o != i for i, o in enumerate(order))
        total += 10
    # 5 of 10 sentences are chosen and shuffled among themselves: 4 of them move on average
    assert abs(moved / total - 0.4) < 0.01


def test_token_permutation_keeps_the_tokens_and_moves_the_rate():
    g = torch.Generator().manual_seed(7)
    moved = 0
    for _ in range(2000):
        x = torch.cat([torch.tensor([0]), torch.arange(4, 54), torch.tensor([2])])
        y = N.permute_tokens(x, 0.2, g)
        assert sorted(y.tolist()) == sorted(x.tolist()) and y[0] == 0 and y[-1] == 2
        moved += int((y != x).sum())
    # ceil(52 * 0.2) = 11 tokens shuffled among themselves: 10 move on average
    assert abs(moved / 2000 - 10) < 0.2


def test_rotation_rate_and_shape():
    g = torch.Generator().manual_seed(8)
    nz = N.Noise(mask_idx=MASK, vocab_size=V, rotate=0.5)
    x = torch.tensor([0, 4, 5, 6, 7, 8, 2])
    rotated = 0
    for _ in range(4000):
        y = nz(x, g)
        body = y[1:-1].tolist()
        assert y[0] == 0 and y[-1] == 2
        i = body.index(4)
        assert body[i:] + body[:i] == [4, 5, 6, 7, 8]
        rotated += body != [4, 5, 6, 7, 8]
    assert N.rotate(x, 2).tolist() == [0, 5, 6, 7, 8, 4, 2]
    # offsets 1..6 are drawn; 1 and 6 (the length - 1) leave the example as it was
    assert abs(rotated / 4000 - 0.5 * 4 / 6) < 0.025


def test_example_generator_depends_on_seed_epoch_and_index_only():
    draw = lambda *key: torch.rand(4, generator=N.example_generator(*key)).tolist()  # noqa: E731
    assert draw(1, 1, 5) == draw(1, 1, 5)
    keys = [(1, 1, 5), (1, 2, 5), (1, 1, 6), (2, 1, 5), (-1, 1, 5)]
    assert len({tuple(draw(*k)) for k in keys}) == len(keys)
