"""seqtrain's batches are fairseq 0.12's, batch for batch, on the full debdesc splits.

`../shared/fixtures/fairseq-batches/` holds what fairseq itself built (see its README): the example sizes of
the train and valid splits, and for each setting of `settings.json` its frozen batches (train: also the order
of epochs 1 and 2 in an uninterrupted run), or the error fairseq raised instead. The batches here come from
the code path training takes: `TranslationTask.get_batch_iterator` on a LanguagePairDataset built from those
sizes, with the arguments seqtrain-train passes for the training and the validation split.
"""

import argparse
import json
import pathlib

import numpy as np
import pytest
import torch

from seqtrain.config import from_args
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.errors import SeqtrainError
from seqtrain.tasks.translation import TranslationConfig, TranslationTask

REPO = pathlib.Path(__file__).resolve().parents[2]  # the repository root
FIXTURE = REPO.parent / "shared" / "fixtures" / "fairseq-batches"
SETTINGS = json.loads((FIXTURE / "settings.json").read_text())["settings"] if FIXTURE.is_dir() else {}
MAX_POSITIONS = (1024, 1024)  # the bart_base model's, as in the fixture's runs


@pytest.fixture(scope="module")
def fixture_dir():
    if not (FIXTURE / "settings.json").exists():
        pytest.skip(
            f"fairseq batch lists not found at {FIXTURE} (they live in ../shared, present in CI, "
            f"absent in a user's clone)"
        )
    return FIXTURE


class Stored(torch.utils.data.Dataset):
    """Token sequences of the given lengths (`</s>` last), standing in for a data-bin split."""

    def __init__(self, sizes, eos):
        self.sizes = sizes
        self.tokens = torch.full((int(sizes.max()),), 4, dtype=torch.long)
        self.tokens[-1] = eos

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return self.tokens[len(self.tokens) - int(self.sizes[i]) :]


def task_and_dataset(fixture_dir, split, truncate_source):
    sizes = np.load(fixture_dir / f"{split}_sizes.npz")
    d = Dictionary()
    args = argparse.Namespace(
        data="data-bin",
        train_subset="train",
        source_lang="source",
        target_lang="target",
        max_source_positions=1024,
        max_target_positions=1024,
        truncate_source=truncate_source,
    )
    src, tgt = sizes["src"], sizes["tgt"]
    dataset = LanguagePairDataset(
        Stored(src, d.eos()),
        src,
        d,
        Stored(tgt, d.eos()),
        tgt,
        d,
        truncate_source=truncate_source,
        max_source_positions=1024,
        max_target_positions=1024,
    )
    return TranslationTask(from_args(TranslationConfig, args), d, d), dataset


def batch_iterator(task, dataset, setting, epoch=1):
    """What seqtrain-train asks the task for: its training iterator, or a validation iterator."""
    train = setting["split"] == "train"
    ignore = True if train else setting["skip_invalid_size_inputs_valid_test"]
    return task.get_batch_iterator(
        dataset,
        max_tokens=setting["max_tokens"],
        max_positions=MAX_POSITIONS,
        ignore_invalid_inputs=ignore,
        required_batch_size_multiple=1,
        seed=setting["seed"],
        epoch=epoch,
        split=setting["split"],
    )


def fairseq_batches(lists, key):
    idx, off = lists[f"{key}_idx"], lists[f"{key}_off"]
    return [idx[off[k] : off[k + 1]] for k in range(len(off) - 1)]


def assert_same_batches(ours, theirs, what):
    assert len(ours) == len(theirs), f"{what}: {len(ours)} batches, fairseq {len(theirs)}"
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert np.array_equal(a, b), f"{what}: batch {k} differs: {a[:8].tolist()}... vs {b[:8].tolist()}..."


@pytest.mark.parametrize("name", sorted(SETTINGS) or ["(fixture absent)"])
def test_batches_are_fairseqs(fixture_dir, name):
    setting = SETTINGS[name]
    task, dataset = task_and_dataset(fixture_dir, setting["split"], setting["truncate_source"])
    if "error" in setting:
        fairseq_message = setting["error"].split(": ", 1)[1]
        with pytest.raises(SeqtrainError) as e:
            batch_iterator(task, dataset, setting)
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"{setting['split']}: {fairseq_message}")
        return
    lists = np.load(fixture_dir / f"{name}.npz")
    itr = batch_iterator(task, dataset, setting)
    frozen = list(itr.frozen_batches)
    assert_same_batches(frozen, fairseq_batches(lists, "frozen"), f"{name} frozen")
    assert sum(len(b) for b in frozen) == setting["examples"] and len(frozen) == setting["batches"]
    if setting["split"] == "valid":  # validation runs the frozen batches in order
        return
    for epoch in (1, 2):
        want = fairseq_batches(lists, f"epoch{epoch}")
        assert_same_batches(itr.epoch_batches(epoch), want, f"{name} epoch {epoch}")


@pytest.mark.parametrize("name", ["train_trunc_mt2048_seed1", "train_notrunc_mt500_seed1"])
@pytest.mark.parametrize("epoch, at", [(1, 700), (1, -2), (2, 0), (2, 1), (2, 1234)])
def test_resumed_run_continues_on_the_uninterrupted_runs_batches(fixture_dir, name, epoch, at):
    """A fresh run restored from a checkpoint taken in `epoch` after `at` batches (< 0: that many before the
    end) trains what the uninterrupted run (fairseq's batch lists) trains next, into the following epoch;
    fairseq itself would rebuild its batches under seed + epoch."""
    setting = SETTINGS[name]
    lists = np.load(fixture_dir / f"{name}.npz")
    want = fairseq_batches(lists, f"epoch{epoch}")
    at = at % len(want)
    task, dataset = task_and_dataset(fixture_dir, "train", setting["truncate_source"])
    # the restart: a new task and dataset; the checkpoint names the epoch to build the iterator for
    itr = batch_iterator(task, dataset, setting, epoch=epoch)
    itr.load_state_dict({"epoch": epoch, "iterations_in_epoch": at, "shuffle": True})
    rest = itr.next_epoch_itr(shuffle=True)
    assert (itr.epoch, rest.n, len(rest)) == (epoch, at, len(want))
    for k in range(at, min(at + 3, len(want))):
        assert sorted(next(rest)["id"].tolist()) == sorted(want[k].tolist())
    if epoch == 1 and not rest.has_next():  # and the epoch after it is the uninterrupted run's too
        assert itr.state_dict() == {"epoch": 2, "iterations_in_epoch": 0, "shuffle": True}
        # what the training loop does at an epoch's end: ask the task again (the same iterator comes back)
        assert batch_iterator(task, dataset, setting, epoch=2) is itr
        after = itr.next_epoch_itr(shuffle=True)
        assert itr.epoch == 2
        assert sorted(next(after)["id"].tolist()) == sorted(fairseq_batches(lists, "epoch2")[0].tolist())


def test_order_seed_is_seed_plus_1_or_the_epoch_when_each_epoch_has_its_own_data_bin():
    """fairseq orders under seed + the epoch an iterator is made in: 1 for a single data-bin (whose batches an
    uninterrupted run keeps), the epoch itself when `data` lists one data-bin per epoch (no fixture needed)."""
    rng = np.random.RandomState(0)
    src, tgt = rng.randint(2, 40, 600), rng.randint(2, 12, 600)  # many ties: the order depends on the seed
    d = Dictionary()

    def frozen(data, seed, epoch):
        args = argparse.Namespace(
            data=data, train_subset="train", max_source_positions=1024, max_target_positions=1024
        )
        dataset = LanguagePairDataset(Stored(src, d.eos()), src, d, Stored(tgt, d.eos()), tgt, d)
        itr = TranslationTask(from_args(TranslationConfig, args), d, d).get_batch_iterator(
            dataset, max_tokens=64, seed=seed, epoch=epoch
        )
        return [b.tolist() for b in itr.frozen_batches]

    first = frozen("bin", seed=1, epoch=1)
    assert frozen("bin", seed=1, epoch=3) == first  # a run resumed in epoch 3 trains the same batches
    assert frozen("bin", seed=3, epoch=1) != first
    assert frozen("bin0:bin1", seed=1, epoch=3) == frozen("bin", seed=3, epoch=1)
    assert frozen("bin0:bin1", seed=1, epoch=1) == first


@pytest.mark.parametrize("mult", [1, 8])
def test_training_leaves_out_a_last_batch_that_is_not_a_multiple_as_fairseq(mult):
    """fairseq 0.12 (data_utils.batch_by_size) drops the last batch when its size is not a multiple of
    --required-batch-size-multiple; training does the same, validation keeps every example."""
    rng = np.random.RandomState(0)
    src, tgt = rng.randint(2, 40, 203), rng.randint(2, 12, 203)
    d = Dictionary()
    args = argparse.Namespace(
        data="bin", train_subset="train", max_source_positions=1024, max_target_positions=1024
    )
    dataset = LanguagePairDataset(Stored(src, d.eos()), src, d, Stored(tgt, d.eos()), tgt, d)
    kw = dict(max_tokens=256, required_batch_size_multiple=mult, seed=1)
    train = (
        TranslationTask(from_args(TranslationConfig, args), d, d)
        .get_batch_iterator(dataset, split="train", **kw)
        .frozen_batches
    )
    valid = (
        TranslationTask(from_args(TranslationConfig, args), d, d)
        .get_batch_iterator(dataset, split="valid", **kw)
        .frozen_batches
    )
    assert sum(len(b) for b in valid) == 203
    if mult == 1:
        assert [b.tolist() for b in train] == [b.tolist() for b in valid]
    else:
        assert len(valid[-1]) % mult != 0  # the data makes a partial last batch ...
        assert [b.tolist() for b in train] == [
            b.tolist() for b in valid[:-1]
        ]  # ... which training leaves out
