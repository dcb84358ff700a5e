import argparse
import logging

import numpy as np
import pytest

from seqtrain.config import from_args
from seqtrain.data.batching import batch_by_size, batch_stats, filter_by_size, resolve_max_positions
from seqtrain.data.options import TrainDatasetConfig, add_dataset_args, check_dataset_args
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.errors import SeqtrainError


def sizes_of(batches, ntok_by_index):
    return [(len(b), int(ntok_by_index[b].max())) for b in batches]


def check_batches(batches, indices, ntok_by_index, max_tokens, max_sentences, mult):
    assert np.array_equal(np.concatenate(batches), indices)  # every index once, order kept
    for _k, b in enumerate(batches):
        assert len(b) > 0
        if max_tokens:
            assert len(b) * ntok_by_index[b].max() <= max_tokens
        if max_sentences:
            assert len(b) <= max_sentences
        assert len(b) % mult == 0 or len(b) < mult  # the last one too: a tail left over is a batch of its own


@pytest.mark.parametrize("seed", range(300))
def test_batches_never_exceed_bounds_random(seed):
    rng = np.random.RandomState(seed)
    n = int(rng.randint(1, 300))
    ntok = rng.randint(1, rng.choice([8, 60, 200]), size=n)
    max_tokens = int(rng.randint(ntok.max(), ntok.max() * 12 + 1))
    max_sentences = [None, int(rng.randint(1, 40))][rng.randint(2)]
    mult = int(rng.choice([1, 2, 3, 8]))
    # sorted (as in training) and unsorted orders
    indices = np.argsort(ntok, kind="mergesort") if seed % 2 else rng.permutation(n)
    batches = batch_by_size(
        indices,
        num_tokens_vec=ntok[indices],
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        required_batch_size_multiple=mult,
    )
    check_batches(batches, indices, ntok, max_tokens, max_sentences, mult)
    if mult == 1:  # greedy: the next example would not have fit
        for b, nxt in zip(batches, batches[1:]):
            grown = np.append(b, nxt[0])
            assert (len(grown) * ntok[grown].max() > max_tokens) or (
                max_sentences and len(grown) > max_sentences
            )


def test_uniform_lengths_give_full_multiples():
    ntok = np.full(1000, 10)
    idx = np.arange(1000)
    batches = batch_by_size(idx, num_tokens_vec=ntok, max_tokens=1000, required_batch_size_multiple=8)
    assert [len(b) for b in batches] == [96] * 10 + [40]
    batches = batch_by_size(idx, num_tokens_vec=ntok, max_tokens=1000)
    assert [len(b) for b in batches] == [100] * 10


def test_tail_after_the_last_multiple_is_a_batch_of_its_own():
    # as fairseq's batch_by_size_vec: 10 examples that fit in one batch make 8 + 2 with a multiple of 8
    batches = batch_by_size(
        np.arange(10), num_tokens_vec=np.full(10, 3), max_tokens=1000, required_batch_size_multiple=8
    )
    assert [len(b) for b in batches] == [8, 2]
    batches = batch_by_size(
        np.arange(21), num_tokens_vec=np.full(21, 3), max_tokens=48, required_batch_size_multiple=4
    )
    assert [len(b) for b in batches] == [16, 4, 1]


def test_tail_that_cannot_join_a_longer_example_becomes_its_own_batch():
    # 4 x 1 fits (multiple of 4); 1,1,1 + a 5 would be 4 x 5 = 20 > 15, so the three ones stand alone.
    ntok = np.array([1] * 7 + [5])
    batches = batch_by_size(np.arange(8), num_tokens_vec=ntok, max_tokens=15, required_batch_size_multiple=4)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6], [7]]


def test_batch_size_cap_below_the_multiple():
    batches = batch_by_size(
        np.arange(10), num_tokens_vec=np.ones(10), max_sentences=4, required_batch_size_multiple=8
    )
    assert [len(b) for b in batches] == [4, 4, 2]


def test_padding_is_counted():
    # 3 x 2 = 6 tokens would fit as real tokens, but padded to the longest it is 3 x 5 = 15 > 10.
    batches = batch_by_size(np.arange(3), num_tokens_vec=np.array([1, 1, 5]), max_tokens=10)
    assert [b.tolist() for b in batches] == [[0, 1], [2]]


def test_example_longer_than_max_tokens_is_an_error():
    # fairseq's words (an AssertionError there), then which example
    with pytest.raises(
        SeqtrainError,
        match=r"^valid: Sentences lengths should not exceed max_tokens=40 "
        r"\(example 7 has 50 tokens\)",
    ):
        batch_by_size(np.array([5, 7]), num_tokens_vec=np.array([3, 50]), max_tokens=40, split="valid")


def test_token_count_sources_agree():
    src = [None] * 6
    ds = LanguagePairDataset(src, [3, 9, 2, 7, 4, 4], _Ids(), src, [5, 1, 1, 8, 2, 6], _Ids())
    idx = ds.ordered_indices(seed=3)
    kw = dict(max_tokens=16, required_batch_size_multiple=2)
    a = batch_by_size(idx, ds.num_tokens, **kw)  # vectorized through ds.num_tokens_vec
    b = batch_by_size(idx, lambda i: ds.num_tokens(i), **kw)  # called per index
    c = batch_by_size(idx, num_tokens_vec=ds.num_tokens_vec(idx), **kw)
    assert [x.tolist() for x in a] == [x.tolist() for x in b] == [x.tolist() for x in c]
    assert sizes_of(a, np.maximum(ds.src_sizes, ds.tgt_sizes)) == [(2, 5), (2, 6), (1, 8), (1, 9)]
    with pytest.raises(TypeError, match="num_tokens_vec="):
        batch_by_size(idx, ds.num_tokens_vec(idx), max_tokens=16)
    assert batch_by_size(np.array([], dtype=np.int64), num_tokens_vec=[], max_tokens=5) == []


def test_batch_stats_counts_padding():
    ntok = np.array([2, 4, 4, 4])
    stats = batch_stats([np.array([0, 1]), np.array([2, 3])], ntok)
    assert stats == {"batches": 2, "sentences": 4, "mean_batch": 2.0, "fill": 14 / 16}


class _Ids:
    def bos(self):
        return 0

    def pad(self):
        return 1

    def eos(self):
        return 2


def _sized(src_sizes, tgt_sizes):
    return LanguagePairDataset(
        [None] * len(src_sizes), src_sizes, _Ids(), [None] * len(tgt_sizes), tgt_sizes, _Ids()
    )


def test_filter_by_size_error_names_split_example_and_limit():
    ds = _sized([5, 30, 6, 8], [3, 4, 20, 2])
    with pytest.raises(SeqtrainError) as e:
        filter_by_size(np.array([0, 2, 1, 3]), ds, (10, 10), split="valid")
    msg = str(e.value)
    assert msg.startswith(
        "valid: Size of sample #2 is invalid (=(6, 20)) since max_positions=(10, 10), "
        "skip this example with --skip-invalid-size-inputs-valid-test"
    )  # fairseq's words
    assert "--skip-invalid-size-inputs-valid-test" in msg and "\n" not in msg


def test_filter_by_size_skips_with_warning(caplog):
    ds = _sized([5, 30, 6, 8, 40], [3, 4, 20, 2, 1])
    with caplog.at_level(logging.WARNING, logger="seqtrain.data.batching"):
        kept = filter_by_size(
            np.array([4, 0, 2, 1, 3]), ds, (10, 10), ignore_invalid_inputs=True, split="train"
        )
    assert kept.tolist() == [0, 3]
    assert "train: skipping 3 examples" in caplog.text and "[4, 2, 1]" in caplog.text
    assert filter_by_size(np.array([0, 3]), ds, 10).tolist() == [0, 3]
    assert filter_by_size(np.array([0, 1]), ds, None).tolist() == [0, 1]
    assert filter_by_size(np.array([0, 1, 2]), ds, (None, 5), ignore_invalid_inputs=True).tolist() == [0, 1]


def test_filter_by_size_with_only_a_sizes_array():
    class Plain:
        sizes = np.array([[3, 2], [9, 2], [3, 12]])

    assert filter_by_size(np.arange(3), Plain(), (8, 10), ignore_invalid_inputs=True).tolist() == [0]
    Plain.sizes = np.array([3, 9, 4])
    assert filter_by_size(np.arange(3), Plain(), 5, ignore_invalid_inputs=True).tolist() == [0, 2]


def test_truncated_sources_pass_the_filter():
    ds = LanguagePairDataset(
        [None] * 2,
        [5, 3000],
        _Ids(),
        [None] * 2,
        [4, 4],
        _Ids(),
        truncate_source=True,
        max_source_positions=1024,
    )
    assert filter_by_size(np.arange(2), ds, (1024, 1024)).tolist() == [0, 1]


def test_resolve_max_positions():
    assert resolve_max_positions((1024, 1024), (512, None), 300) == (300, 300)
    assert resolve_max_positions((1024, 512), None, 600) == (600, 512)
    assert resolve_max_positions(None, None) is None


def test_fairseq_batch_count_on_fairseq_data(fairseq_tiny):
    idx = pytest.importorskip("seqtrain.data.indexed_dataset")
    b = fairseq_tiny / "data-bin"
    counts = {}
    for split, shuffle in (("train", True), ("valid", False)):
        src = idx.MMapIndexedDataset(str(b / f"{split}.src-tgt.src"))
        tgt = idx.MMapIndexedDataset(str(b / f"{split}.src-tgt.tgt"))
        ds = LanguagePairDataset(src, src.sizes, _Ids(), tgt, tgt.sizes, _Ids(), shuffle=shuffle)
        order = filter_by_size(ds.ordered_indices(seed=1), ds, resolve_max_positions((1024, 1024), 2048))
        batches = batch_by_size(order, ds.num_tokens, max_tokens=2048, required_batch_size_multiple=8)
        check_batches(batches, order, ds.num_tokens_vec(np.arange(len(ds))), 2048, None, 8)
        counts[split] = (len(batches), sum(len(x) for x in batches))
    # train.log of the fairseq run: "epoch 001: 10 / 16", valid "bsz 100" over 200 examples
    assert counts == {"train": (16, 3000), "valid": (2, 200)}


# -- flags -----------------------------------------------------------------------------------------------------


def parse(argv, **kw):
    p = argparse.ArgumentParser()
    add_dataset_args(p, **kw)
    return p.parse_args(argv)


def test_flag_defaults_match_fairseq():
    a = parse([])
    assert (a.max_tokens, a.batch_size, a.required_batch_size_multiple) == (None, None, 8)
    assert (a.left_pad_source, a.left_pad_target, a.prepend_bos, a.truncate_source) == (
        True,
        False,
        False,
        False,
    )
    assert (a.train_subset, a.valid_subset, a.max_tokens_valid, a.batch_size_valid) == (
        "train",
        "valid",
        None,
        None,
    )
    assert (a.source_lang, a.target_lang, a.num_workers) == (None, None, 1)  # fairseq's default
    assert a.skip_invalid_size_inputs_valid_test is False
    assert not hasattr(a, "gen_subset")
    g = parse([], train=False, gen=True)
    assert g.gen_subset == "test" and not hasattr(g, "train_subset")


def test_flag_spellings():
    a = parse(
        [
            "--max-sentences",
            "16",
            "--max-sentences-valid",
            "4",
            "-s",
            "src",
            "-t",
            "tgt",
            "--left-pad-source",
            "False",
            "--left-pad-target",
            "true",
        ]
    )
    assert (a.batch_size, a.batch_size_valid, a.source_lang, a.target_lang) == (16, 4, "src", "tgt")
    assert (a.left_pad_source, a.left_pad_target) == (False, True)
    a = parse(
        ["--left-pad-source", "--left-pad-target", "--batch-size", "3"]
    )  # fairseq 0.12: bare flag flips
    assert (a.left_pad_source, a.left_pad_target, a.batch_size) == (False, True, 3)
    with pytest.raises(SystemExit):
        parse(["--left-pad-source", "maybe"])


def train_config(argv):
    return from_args(TrainDatasetConfig, parse(argv))


def test_check_dataset_args():
    with pytest.raises(SeqtrainError, match="--max-tokens or --batch-size"):
        check_dataset_args(train_config([]))
    with pytest.raises(SeqtrainError, match="--max-tokens must be positive"):
        check_dataset_args(train_config(["--max-tokens", "0"]))
    a = check_dataset_args(train_config(["--max-tokens", "4096", "--batch-size", "32"]))
    assert (a.max_tokens_valid, a.batch_size_valid) == (4096, 32)
    a = check_dataset_args(train_config(["--max-tokens", "4096", "--max-tokens-valid", "1024"]))
    assert (a.max_tokens_valid, a.batch_size_valid) == (1024, None)
