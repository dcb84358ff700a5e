import math

import numpy as np
import pytest
import torch

from seqtrain.data.iterators import CountingIterator, EpochBatchIterator, GroupedIterator, shard
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.errors import SeqtrainError


class Recorded(torch.utils.data.Dataset):
    """Items are their own index; remembers which indices were read."""

    def __init__(self, n):
        self.n = n
        self.reads = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads.append(int(i))
        return int(i)


def ids_collate(samples):
    return list(samples)


def make_batches(n_batches, per=3):
    return [np.arange(k * per, (k + 1) * per) for k in range(n_batches)]


def make_itr(n_batches=10, **kw):
    batches = make_batches(n_batches)
    return EpochBatchIterator(Recorded(n_batches * 3), ids_collate, batches, **kw)


def run_epoch(ebi, shuffle=True):
    return [tuple(b) for b in ebi.next_epoch_itr(shuffle=shuffle)]


def test_every_batch_once_per_epoch_order_changes_with_epoch():
    ebi = make_itr(12, seed=5)
    e1, e2 = run_epoch(ebi), run_epoch(ebi)
    assert ebi.epoch == 2
    want = sorted(tuple(b.tolist()) for b in make_batches(12))
    assert sorted(e1) == sorted(e2) == want
    assert e1 != e2
    # same seed, same orders; fairseq's numpy_seed(seed + epoch) + np.random.shuffle gives the same permutation
    again = make_itr(12, seed=5)
    assert run_epoch(again) == e1 and run_epoch(again) == e2
    ref = list(make_batches(12))
    np.random.RandomState(5 + 1).shuffle(ref)
    assert e1 == [tuple(b.tolist()) for b in ref]
    assert run_epoch(make_itr(12, seed=6)) != e1
    assert run_epoch(make_itr(12, seed=5), shuffle=False) == want


def test_counting_iterator_fields():
    ebi = make_itr(4)
    assert (ebi.epoch, ebi.next_epoch_idx, ebi.iterations_in_epoch, len(ebi)) == (1, 1, 0, 4)
    assert not ebi.end_of_epoch()
    itr = ebi.next_epoch_itr()
    assert (len(itr), itr.n, itr.has_next()) == (4, 0, True)
    next(itr), next(itr)
    assert (itr.n, ebi.iterations_in_epoch, ebi.next_epoch_idx) == (2, 2, 1)
    list(itr)
    assert ebi.end_of_epoch() and not itr.has_next() and itr.n == 4
    assert ebi.next_epoch_idx == 2
    assert ebi.state_dict() == {"epoch": 2, "iterations_in_epoch": 0, "shuffle": True}


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_mid_epoch_yields_exactly_the_rest(shuffle):
    n = 9
    full = make_itr(n, seed=3)
    uninterrupted = [run_epoch(full, shuffle) for _ in range(2)]
    for k in range(1, n):
        ebi = make_itr(n, seed=3)
        itr = ebi.next_epoch_itr(shuffle=shuffle)
        seen = [tuple(next(itr)) for _ in range(k)]
        state = ebi.state_dict()
        assert state == {"epoch": 1, "iterations_in_epoch": k, "shuffle": shuffle}

        resumed = make_itr(n, seed=3)
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.next_epoch_idx, resumed.iterations_in_epoch) == (1, 1, k)
        itr2 = resumed.next_epoch_itr(shuffle=not shuffle)  # the saved choice wins for the restored epoch
        assert (itr2.n, len(itr2)) == (k, n)
        rest = [tuple(b) for b in itr2]
        assert seen + rest == uninterrupted[0]
        # nothing before the position was read or collated
        assert sorted(resumed.dataset.reads) == sorted(i for b in rest for i in b)
        assert resumed.end_of_epoch() and resumed.epoch == 1
        assert run_epoch(resumed, shuffle) == uninterrupted[1]


def test_resume_at_epoch_end_continues_with_next_epoch():
    full = make_itr(6, seed=2)
    epochs = [run_epoch(full) for _ in range(3)]
    ebi = make_itr(6, seed=2)
    run_epoch(ebi)
    state = ebi.state_dict()
    assert state == {"epoch": 2, "iterations_in_epoch": 0, "shuffle": True}
    resumed = make_itr(6, seed=2)
    resumed.load_state_dict(state)
    assert resumed.next_epoch_idx == 2
    assert run_epoch(resumed) == epochs[1] and resumed.epoch == 2
    assert run_epoch(resumed) == epochs[2]
    # loading into an iterator that already ran does not skip an epoch
    ebi.load_state_dict(state)
    assert run_epoch(ebi) == epochs[1]


def test_resume_past_the_end_is_a_clear_error():
    ebi = make_itr(5)
    with pytest.raises(SeqtrainError, match="batch 5 of epoch 3: this epoch has only 5 batches"):
        ebi.load_state_dict({"epoch": 3, "iterations_in_epoch": 5, "shuffle": True})


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("fix", [False, True])
def test_shards_cover_every_batch_once_with_equal_lengths(num_shards, fix):
    n = 13
    for epoch_runs in range(2):
        got, lengths = [], []
        for rank in range(num_shards):
            ebi = make_itr(n, seed=4, num_shards=num_shards, shard_id=rank)
            for _ in range(epoch_runs):
                run_epoch(ebi)
            itr = ebi.next_epoch_itr(fix_batches_to_gpus=fix)
            lengths.append(len(itr))
            assert len(ebi) == len(itr)
            batches = [tuple(b) for b in itr]
            assert len(batches) == len(itr)
            got.extend(batches)
        assert lengths == [math.ceil(n / num_shards)] * num_shards
        real = [b for b in got if b]
        assert sorted(real) == sorted(tuple(b.tolist()) for b in make_batches(n))
        assert len(got) - len(real) == num_shards * math.ceil(n / num_shards) - n  # fillers are empty batches


def test_fixed_batches_stay_on_their_rank():
    ebi = make_itr(10, seed=1, num_shards=3, shard_id=1)
    e1 = run_epoch_fixed(ebi)
    e2 = run_epoch_fixed(ebi)
    assert sorted(e1) == sorted(e2) and e1 != e2
    assert sorted(b for b in e1 if b) == sorted(tuple(b.tolist()) for b in make_batches(10)[1::3])


def run_epoch_fixed(ebi):
    return [tuple(b) for b in ebi.next_epoch_itr(fix_batches_to_gpus=True)]


def test_sharded_resume():
    full = make_itr(11, seed=7, num_shards=2, shard_id=1)
    want = run_epoch(full)
    ebi = make_itr(11, seed=7, num_shards=2, shard_id=1)
    itr = ebi.next_epoch_itr()
    head = [tuple(next(itr)) for _ in range(4)]
    resumed = make_itr(11, seed=7, num_shards=2, shard_id=1)
    resumed.load_state_dict(ebi.state_dict())
    assert head + run_epoch(resumed) == want


def test_empty_filler_batch_collates_to_empty_dict_and_first_batch_is_real():
    src = [torch.tensor([5, 2]), torch.tensor([6, 7, 2]), torch.tensor([8, 2])]

    class Ids:
        bos, pad, eos = (lambda self: 0), (lambda self: 1), (lambda self: 2)

    ds = LanguagePairDataset(src, [2, 3, 2], Ids(), src, [2, 3, 2], Ids())
    batches = [[0, 1], [2]]
    ranks = [EpochBatchIterator(ds, ds.collater, batches, num_shards=3, shard_id=r) for r in range(3)]
    out = [list(r.next_epoch_itr(shuffle=False)) for r in ranks]
    assert [b["id"].tolist() for b in (out[0][0], out[1][0])] == [[1, 0], [2]]
    assert out[2] == [{}]
    assert ranks[2].first_batch["id"].tolist() == [1, 0]


def test_dataloader_workers_and_background_buffer_give_the_same_batches():
    base = run_epoch(make_itr(7, seed=9))
    assert run_epoch(make_itr(7, seed=9, buffer_size=2)) == base
    workers = make_itr(7, seed=9, num_workers=1)
    ebi_itr = workers.next_epoch_itr()
    first = [tuple(next(ebi_itr)) for _ in range(3)]
    resumed = make_itr(7, seed=9, num_workers=1)
    resumed.load_state_dict(workers.state_dict())
    assert first + run_epoch(resumed) == base


def test_background_buffer_reraises_errors():
    class Broken(Recorded):
        def __getitem__(self, i):
            if i == 4:
                raise ValueError("bad item 4")
            return int(i)

    ebi = EpochBatchIterator(Broken(6), ids_collate, make_batches(2), buffer_size=3)
    with pytest.raises(ValueError, match="bad item 4"):
        list(ebi.next_epoch_itr(shuffle=False))


def test_grouped_and_counting_helpers():
    itr = CountingIterator(range(7))
    groups = GroupedIterator(itr, 3)
    assert len(groups) == 3
    assert list(groups) == [[0, 1, 2], [3, 4, 5], [6]] and groups.n == 3
    resumed = GroupedIterator(CountingIterator(range(3, 7), start=3), 3)
    assert (resumed.n, len(resumed), list(resumed)) == (1, 3, [[3, 4, 5], [6]])
    taken = CountingIterator(range(10)).take(4)
    assert list(taken) == [0, 1, 2, 3] and len(taken) == 4
    assert list(CountingIterator(range(5)).skip(2)) == [2, 3, 4]
    short = CountingIterator(iter([1, 2]), total=3)
    with pytest.raises(IndexError, match="ended at 2, expected 3"):
        list(short)


def test_shard_helper():
    assert shard(list("abcde"), 2, 1, fill_value=None) == ["b", "d", None]
    assert shard(list("abcd"), 2, 0) == ["a", "c"]


def pid_collate(samples):
    import os

    return [*samples, os.getpid()]


def test_dataloader_workers_live_across_epochs_and_resume_exactly():
    """--num-workers: one DataLoader whose worker is started once and serves every epoch (same process id),
    with each epoch's batches those of the in-process path, also after a mid-epoch resume."""
    base = make_itr(5, seed=4)
    expected = [run_epoch(base) for _ in range(3)]
    ebi = EpochBatchIterator(Recorded(15), pid_collate, make_batches(5), seed=4, num_workers=1)
    epochs = [[tuple(b) for b in ebi.next_epoch_itr()] for _ in range(2)]
    pids = {b[-1] for epoch in epochs for b in epoch}
    assert len(pids) == 1 and pids != {__import__("os").getpid()}
    assert [[b[:-1] for b in epoch] for epoch in epochs] == expected[:2]
    itr = ebi.next_epoch_itr()
    first = [tuple(next(itr))[:-1] for _ in range(2)]
    resumed = EpochBatchIterator(Recorded(15), pid_collate, make_batches(5), seed=4, num_workers=1)
    resumed.load_state_dict(ebi.state_dict())
    assert first + [tuple(b)[:-1] for b in resumed.next_epoch_itr()] == expected[2]
    assert {b[-1] for b in itr} == pids  # the rest of epoch 3, by the same worker


def test_close_stops_the_background_thread_and_the_worker_processes_mid_epoch():
    """A run that ends mid-epoch leaves no thread inside a collate and no DataLoader worker behind: the
    background thread (blocked on a full queue) and the persistent worker processes stop, and the position
    is kept."""
    import multiprocessing
    import threading

    before = set(threading.enumerate())
    buffered = make_itr(7, seed=9, buffer_size=1)
    itr = buffered.next_epoch_itr()
    next(itr)
    thread = buffered._background._thread
    assert thread.is_alive()  # waiting to queue the next batches
    buffered.close()
    assert not thread.is_alive() and set(threading.enumerate()) <= before

    workers = make_itr(7, seed=9, num_workers=1)
    itr = workers.next_epoch_itr()
    next(itr)
    assert len(multiprocessing.active_children()) >= 1
    state = workers.state_dict()
    workers.close()
    assert multiprocessing.active_children() == []
    assert workers.state_dict() == state == {"epoch": 1, "iterations_in_epoch": 1, "shuffle": True}
    resumed = make_itr(7, seed=9, num_workers=1)  # and the next epoch starts workers anew
    resumed.load_state_dict({"epoch": 2, "iterations_in_epoch": 0, "shuffle": True})
    workers.load_state_dict({"epoch": 2, "iterations_in_epoch": 0, "shuffle": True})
    assert run_epoch(workers) == run_epoch(resumed)
    workers.close()
    resumed.close()
    assert multiprocessing.active_children() == []
