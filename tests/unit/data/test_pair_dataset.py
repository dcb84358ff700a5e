import numpy as np
import pytest
import torch

from seqtrain.data.pair_dataset import LanguagePairDataset, shift_eos_to_front
from seqtrain.errors import SeqtrainError

BOS, PAD, EOS = 0, 1, 2


class SpecialIds:
    """The four ids a dataset needs; fairseq's layout (<s>=0 <pad>=1 </s>=2 <unk>=3)."""

    def bos(self):
        return BOS

    def pad(self):
        return PAD

    def eos(self):
        return EOS


def T(*xs):
    return torch.tensor(xs, dtype=torch.long)


SRC = [T(5, 6, EOS), T(7, EOS), T(8, 9, 10, EOS)]
TGT = [T(11, EOS), T(12, 13, 14, EOS), T(15, EOS)]


def make(src=SRC, tgt=TGT, **kw):
    d = SpecialIds()
    src_sizes = np.array([len(s) for s in src])
    tgt_sizes = None if tgt is None else np.array([len(t) for t in tgt])
    return LanguagePairDataset(src, src_sizes, d, tgt, tgt_sizes, d, **kw)


def collate_all(ds):
    return ds.collater([ds[i] for i in range(len(ds))])


def test_collate_pads_source_left_target_right_and_shifts_eos():
    b = collate_all(make())
    assert b["id"].tolist() == [2, 0, 1]  # longest source first
    assert b["nsentences"] == 3
    assert b["ntokens"] == 2 + 4 + 2  # target tokens, </s> included, pads not
    assert torch.equal(b["net_input"]["src_lengths"], T(4, 3, 2))
    assert torch.equal(
        b["net_input"]["src_tokens"], torch.tensor([[8, 9, 10, 2], [1, 5, 6, 2], [1, 1, 7, 2]])
    )
    assert torch.equal(b["target"], torch.tensor([[15, 2, 1, 1], [11, 2, 1, 1], [12, 13, 14, 2]]))
    assert torch.equal(
        b["net_input"]["prev_output_tokens"], torch.tensor([[2, 15, 1, 1], [2, 11, 1, 1], [2, 12, 13, 14]])
    )


def test_padding_sides_are_configurable():
    b = collate_all(make(left_pad_source=False, left_pad_target=True))
    assert torch.equal(
        b["net_input"]["src_tokens"], torch.tensor([[8, 9, 10, 2], [5, 6, 2, 1], [7, 2, 1, 1]])
    )
    assert torch.equal(b["target"], torch.tensor([[1, 1, 15, 2], [1, 1, 11, 2], [12, 13, 14, 2]]))
    assert torch.equal(
        b["net_input"]["prev_output_tokens"], torch.tensor([[1, 1, 2, 15], [1, 1, 2, 11], [2, 12, 13, 14]])
    )


def test_equal_source_lengths_keep_batch_order():
    src = [T(5, EOS), T(6, EOS), T(7, 8, EOS), T(9, EOS)]
    tgt = [T(i, EOS) for i in (20, 21, 22, 23)]
    ds = make(src, tgt)
    b = ds.collater([ds[i] for i in (3, 0, 2, 1)])
    assert b["id"].tolist() == [2, 3, 0, 1]


def test_shift_eos_to_front():
    assert shift_eos_to_front(T(4, 5, 6, EOS), EOS).tolist() == [EOS, 4, 5, 6]
    assert shift_eos_to_front(T(BOS, 4, EOS), EOS).tolist() == [EOS, BOS, 4]


def test_prepend_bos_on_both_sides():
    ds = make(prepend_bos=True)
    assert ds[0]["source"].tolist() == [BOS, 5, 6, EOS]
    assert ds[0]["target"].tolist() == [BOS, 11, EOS]
    assert ds.src_sizes.tolist() == [4, 3, 5] and ds.tgt_sizes.tolist() == [3, 5, 3]
    b = collate_all(ds)
    assert torch.equal(b["net_input"]["src_tokens"][1], T(1, 0, 5, 6, 2))
    assert torch.equal(b["target"][1], T(0, 11, 2, 1, 1))
    assert torch.equal(b["net_input"]["prev_output_tokens"][1], T(2, 0, 11, 1, 1))
    assert b["ntokens"] == 3 + 3 + 5


def test_truncate_source_keeps_eos_and_sizes_are_fairseqs():
    src = [T(3, 4, 5, 6, 7, EOS), T(8, 9, EOS), T(10, 11, 12, EOS), T(13, EOS)]
    tgt = [T(20, EOS)] * 4
    ds = make(src, tgt, truncate_source=True, max_source_positions=4)
    items = [[3, 4, 5, EOS], [8, 9, EOS], [10, 11, 12, EOS], [13, EOS]]
    assert [ds[i]["source"].tolist() for i in range(4)] == items
    # the sizes batching uses are fairseq's: a source that is not cut counts one more token (its recorded size
    # keeps </s> through the strip / truncate / append chain), one that is cut counts max_source_positions
    assert ds.src_sizes.tolist() == [4, 4, 4, 3]
    assert ds.num_tokens(3) == 3 and ds.size(1) == (4, 2)
    # with <s>, the whole item still fits the limit
    ds = make(src, tgt, truncate_source=True, max_source_positions=4, prepend_bos=True)
    assert [ds[i]["source"].tolist() for i in range(4)] == [
        [BOS, 3, 4, EOS],
        [BOS, 8, 9, EOS],
        [BOS, 10, 11, EOS],
        [BOS, 13, EOS],
    ]
    assert ds.src_sizes.tolist() == [4, 4, 4, 4]
    assert make(src, tgt).src_sizes.tolist() == [len(s) for s in src]  # without truncation: the lengths


def test_truncation_needs_room_for_eos():
    with pytest.raises(SeqtrainError, match="--max-source-positions of at least 3"):
        make(truncate_source=True, max_source_positions=2, prepend_bos=True)


def test_source_only_batch_for_generation():
    ds = make(tgt=None)
    b = collate_all(ds)
    assert b["target"] is None and "prev_output_tokens" not in b["net_input"]
    assert b["ntokens"] == 9
    assert ds.sizes.tolist() == [3, 2, 4] and ds.num_tokens(2) == 4 and ds.size(1) == (2, 0)


def test_empty_batch_collates_to_empty_dict():
    assert make().collater([]) == {}


def test_sizes_and_num_tokens():
    ds = make()
    assert ds.sizes.tolist() == [[3, 2], [2, 4], [4, 2]]
    assert [ds.num_tokens(i) for i in range(3)] == [3, 4, 4]
    assert ds.num_tokens_vec(np.array([2, 0])).tolist() == [4, 3]
    assert ds.size(1) == (2, 4)


def test_items_are_long_tensors_from_any_int_input():
    src = [np.array([5, 2], dtype=np.uint16), torch.tensor([6, 2], dtype=torch.int32)]
    tgt = [[7, 2], [8, 2]]
    ds = make(src, tgt)
    assert ds[0]["source"].dtype == torch.long and ds[1]["target"].tolist() == [8, 2]


def test_ordered_indices_sort_by_source_then_target_with_seeded_ties():
    rng = np.random.RandomState(0)
    n = 200
    src_sizes, tgt_sizes = rng.randint(1, 6, n), rng.randint(1, 4, n)
    ds = LanguagePairDataset([None] * n, src_sizes, SpecialIds(), [None] * n, tgt_sizes, SpecialIds())
    order = ds.ordered_indices(seed=7)
    assert sorted(order.tolist()) == list(range(n))
    keys = list(zip(src_sizes[order], tgt_sizes[order]))
    assert keys == sorted(keys)
    assert np.array_equal(order, ds.ordered_indices(seed=7))
    assert not np.array_equal(order, ds.ordered_indices(seed=8))
    # fairseq computes the same inside numpy_seed(seed) with the global RNG
    state = np.random.get_state()
    np.random.seed(7)
    ref = np.random.permutation(n)
    np.random.set_state(state)
    ref = ref[np.argsort(tgt_sizes[ref], kind="mergesort")]
    ref = ref[np.argsort(src_sizes[ref], kind="mergesort")]
    assert np.array_equal(order, ref)
    ds.shuffle = False
    plain = ds.ordered_indices()
    assert list(zip(src_sizes[plain], tgt_sizes[plain], plain)) == sorted(zip(src_sizes, tgt_sizes, range(n)))


def test_mismatched_inputs_are_refused():
    with pytest.raises(SeqtrainError, match="different numbers of examples"):
        make(SRC, TGT[:2])

    class OtherPad(SpecialIds):
        def pad(self):
            return 0

    with pytest.raises(SeqtrainError, match="<pad>"):
        LanguagePairDataset(SRC, [3, 2, 4], SpecialIds(), TGT, [2, 4, 2], OtherPad())


def test_with_real_dictionary():
    dmod = pytest.importorskip("seqtrain.data.dictionary")
    d = dmod.Dictionary()
    for w in "a b c d".split():
        d.add_symbol(w)
    src = [d.encode_line("a b c", add_if_not_exist=False), d.encode_line("d", add_if_not_exist=False)]
    tgt = [d.encode_line("c", add_if_not_exist=False), d.encode_line("b a", add_if_not_exist=False)]
    ds = LanguagePairDataset(src, [len(s) for s in src], d, tgt, [len(t) for t in tgt], d)
    b = collate_all(ds)
    a, bb, c, dd = (d.index(w) for w in "abcd")
    assert b["net_input"]["src_tokens"].tolist() == [[a, bb, c, d.eos()], [d.pad(), d.pad(), dd, d.eos()]]
    assert b["target"].tolist() == [[c, d.eos(), d.pad()], [bb, a, d.eos()]]
    assert b["net_input"]["prev_output_tokens"].tolist() == [[d.eos(), c, d.pad()], [d.eos(), bb, a]]


def test_matches_fairseq_batch_on_fairseq_data(fairseq_tiny):
    idx = pytest.importorskip("seqtrain.data.indexed_dataset")
    dmod = pytest.importorskip("seqtrain.data.dictionary")
    bin_dir = fairseq_tiny / "data-bin"
    src = idx.MMapIndexedDataset(str(bin_dir / "valid.src-tgt.src"))
    tgt = idx.MMapIndexedDataset(str(bin_dir / "valid.src-tgt.tgt"))
    d = dmod.Dictionary.load(str(bin_dir / "dict.src.txt"))
    ds = LanguagePairDataset(src, src.sizes, d, tgt, tgt.sizes, d)
    ref = torch.load(fairseq_tiny / "reference_forward.pt", weights_only=False)[4]
    b = ds.collater([ds[i] for i in ref["ids"]])
    assert torch.equal(b["net_input"]["src_tokens"], ref["src_tokens"])
    assert torch.equal(b["net_input"]["src_lengths"], ref["src_lengths"])
    assert torch.equal(b["net_input"]["prev_output_tokens"], ref["prev_output_tokens"])
    assert torch.equal(b["target"], ref["target"])


# -- merging an update's batches into one pass (--merge-max-tokens) -------------------------------------------


def _random_pairs(n, seed):
    """n pairs of random lengths (sources 2-12 tokens, targets 1-7), so batches differ in width."""
    g = torch.Generator().manual_seed(seed)
    src = [
        torch.cat([torch.randint(4, 50, (int(k),), generator=g), T(EOS)]) for k in torch.randint(1, 12, (n,))
    ]
    tgt = [
        torch.cat([torch.randint(4, 50, (int(k),), generator=g), T(EOS)]) for k in torch.randint(0, 7, (n,))
    ]
    return src, tgt


def _assert_same_batch(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_same_batch(a[k], b[k])
        elif torch.is_tensor(a[k]):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"left_pad_source": False, "left_pad_target": True},
        {"prepend_bos": True, "pad_to_multiple": 8},
        {"truncate_source": True, "max_source_positions": 6},
    ],
    ids=["fairseq", "other-sides", "bos-multiple-8", "truncated"],
)
def test_merged_batches_are_the_collater_of_all_their_examples(kw):
    """Merging collated batches gives, tensor for tensor, what the collater makes of all their examples at
    once: tokens on the dataset's padding sides, lengths, ids, ntokens, the packing layout, the target rows."""
    src, tgt = _random_pairs(24, seed=3)
    ds = make(src, tgt, **kw)
    parts = [[0, 5, 9], list(range(10, 18)), [1, 2, 3, 4, 21]]
    batches = [ds.collater([ds[i] for i in p]) for p in parts]
    merged = ds.merge_batches(batches)
    _assert_same_batch(merged, ds.collater([ds[i] for p in parts for i in p]))
    assert merged["ntokens"] == sum(b["ntokens"] for b in batches)
    assert merged["nsentences"] == 16
    assert list(merged) == list(batches[0]) and list(merged["net_input"]) == list(batches[0]["net_input"])
    _assert_same_batch(ds.merge_batches([batches[1], {}]), batches[1])  # one batch: itself


def test_merge_plan_groups_consecutive_batches_within_the_token_budget():
    from seqtrain.data.pair_dataset import merge_plan

    # (rows, width): merged slots are all rows x the widest
    shapes = [(10, 20), (10, 30), (4, 100), (2, 100), (40, 10)]
    assert merge_plan(shapes, 600) == [[0, 1], [2, 3], [4]]  # 20 x 30; 6 x 100; 40 x 10
    assert merge_plan(shapes, 599) == [[0], [1], [2], [3], [4]]  # one slot short of both pairs
    assert merge_plan(shapes[1:], 4 * 100 + 10 * 100) == [[0, 1], [2], [3]]  # the narrow one pads up
    assert merge_plan(shapes, 66 * 100) == [[0, 1, 2, 3, 4]]
    assert merge_plan(shapes, 0) == [[0], [1], [2], [3], [4]]  # nothing fits: accumulation as before
    assert merge_plan([], 100) == []


def test_merge_update_leaves_single_and_empty_batches_alone():
    src, tgt = _random_pairs(12, seed=4)
    ds = make(src, tgt)
    a, b = ds.collater([ds[i] for i in range(6)]), ds.collater([ds[i] for i in range(6, 12)])
    merged = ds.merge_update([a, {}, b], max_tokens=10_000)
    assert len(merged) == 1 and merged[0]["nsentences"] == 12  # the short shard's empty batch is left out
    assert ds.merge_update([a, b], max_tokens=1) == [a, b]  # over the budget: accumulate
    assert ds.merge_update([{}, {}], max_tokens=10_000) == [{}, {}]  # only filler: run as before
    assert ds.merge_update([a], max_tokens=10_000) == [a]


@pytest.mark.cuda
def test_merged_batches_of_pinned_batches_are_pinned():
    """The iterator pins batches when CUDA is there (copies to the device run asynchronously); a merged batch made
    of them is pinned too, and holds the same values."""
    from seqtrain.data.iterators import pinned

    src, tgt = _random_pairs(12, seed=5)
    ds = make(src, tgt)
    a, b = (pinned(ds.collater([ds[i] for i in r])) for r in (range(6), range(6, 12)))
    (merged,) = ds.merge_update([a, b], max_tokens=10_000)
    for t in (merged["net_input"]["src_tokens"], merged["target"], merged["target_rows"]):
        assert t.is_pinned()
    _assert_same_batch(merged, ds.merge_batches([a, b]))
