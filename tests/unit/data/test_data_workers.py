"""Forked DataLoader workers (--num-workers) do not keep copies of the training state.

A worker forked after the model exists inherits, copy-on-write, the pages of the weights (and, after a resume,
of the optimizer state); the trainer then rewrites them every update, so without care the process tree holds
one more copy of the weights per worker. Each worker frees the tensors registered with `spare_data_workers`
(the Trainer registers its own) as it starts.
"""

import os
import sys

import numpy as np
import pytest
import torch

from seqtrain.data import iterators
from seqtrain.data.iterators import EpochBatchIterator, spare_data_workers
from tests.unit.train.test_sync_free import batches, build_trainer, databin  # noqa: F401 (databin: a fixture)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="needs fork and /proc (Linux)")


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return int(i)


def resident_kb() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class Owner:
    """Holds 256 MiB of touched fp32 weights, as a trainer holds its model."""

    def __init__(self):
        self.weights = torch.full((64 * 2**20,), 0.5)

    def tensors(self):
        return [self.weights]


def worker_view(owner: Owner):
    """A collate_fn that reports what its worker process sees: its resident memory and the owner's weights."""

    def collate(samples):
        return {"pid": os.getpid(), "rss_kb": resident_kb(), "numel": owner.weights.numel()}

    return collate


def first_batch_in_worker(owner: Owner) -> dict:
    itr = EpochBatchIterator(Items(), worker_view(owner), [np.arange(2), np.arange(2, 4)], num_workers=1)
    try:
        return next(itr.next_epoch_itr(shuffle=False))
    finally:
        itr.close()


def test_a_worker_frees_the_inherited_pages_of_registered_tensors(monkeypatch):
    monkeypatch.setattr(iterators, "_SPARED", [])
    owner = Owner()
    kept = first_batch_in_worker(owner)
    spare_data_workers(owner.tensors)
    freed = first_batch_in_worker(owner)
    assert kept["pid"] != os.getpid() and freed["pid"] != kept["pid"]
    assert kept["numel"] == 64 * 2**20 and freed["numel"] == 0
    # the worker's resident memory drops by (nearly) the 256 MiB it no longer maps
    assert kept["rss_kb"] - freed["rss_kb"] > 200 * 1024, (kept, freed)
    assert owner.weights.numel() == 64 * 2**20 and float(owner.weights[-1]) == 0.5  # the parent keeps its own
    del owner
    assert first_batch_in_worker(Owner())["numel"] == 64 * 2**20  # a dead owner's registration is gone


def test_the_trainer_registers_weights_gradients_and_adam_state(databin, tmp_path, monkeypatch):  # noqa: F811
    """After an update (weights, gradients and both Adam moments exist), a worker forked by the training data
    iterator sees none of them, while the trainer keeps training on its own."""
    monkeypatch.setattr(iterators, "_SPARED", [])
    trainer = build_trainer(databin, str(tmp_path), "--cpu", "--optimizer", "adam")
    first, second = batches(trainer, packed=False)
    assert trainer.train_step([first]) is not None
    state = trainer.state_tensors()
    adam = trainer.optimizer.optimizer.state
    expected = {id(p) for p in trainer.model.parameters()}
    expected |= {id(p.grad) for p in trainer.model.parameters()}
    expected |= {id(s[k]) for s in adam.values() for k in ("exp_avg", "exp_avg_sq")}
    assert expected <= {id(t) for t in state}
    weights = sum(p.numel() for p in trainer.model.parameters())
    held = sum(t.numel() for t in state)
    assert held >= 4 * weights  # weights, gradients, two moments

    def count_state(samples):
        return {"numel": sum(t.numel() for t in trainer.state_tensors()), "pid": os.getpid()}

    dataset = trainer.task.dataset("train")
    itr = EpochBatchIterator(dataset, count_state, [np.arange(2)], num_workers=1)
    try:
        seen = next(itr.next_epoch_itr(shuffle=False))
    finally:
        itr.close()
    assert seen["pid"] != os.getpid() and seen["numel"] == 0
    assert sum(t.numel() for t in trainer.state_tensors()) == held
    assert trainer.train_step([second]) is not None  # the parent's state is intact
