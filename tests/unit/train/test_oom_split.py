"""Out of memory that adapts: a batch that runs out of memory is split in two and the update run again, giving
the unsplit update's parameters up to summation order (an injected OOM on the CPU, dropout off)."""

from __future__ import annotations

import logging

import pytest
import torch

from seqtrain.data.pair_dataset import split_batch
from tests.unit.train.test_sync_free import batches, build_trainer, databin  # noqa: F401 (databin: a fixture)


def oom_above(trainer, max_sentences: int, monkeypatch) -> list[int]:
    """Make the trainer's task run out of memory on batches of more than `max_sentences`, as on a CUDA device
    (the trainer adapts only there: on the CPU the error is not swallowed); returns the sizes it saw."""
    seen, real = [], trainer.task.train_step
    monkeypatch.setattr(trainer, "device", torch.device("cuda"))
    monkeypatch.setattr(trainer, "prepare_sample", lambda s: s)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def train_step(sample, *a, **kw):
        seen.append(sample["nsentences"])
        if sample["nsentences"] > max_sentences:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return real(sample, *a, **kw)

    trainer.task.train_step = train_step
    return seen


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_split_batches_hold_the_same_examples(databin, tmp_path, packed):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path), "--dropout", "0")
    batch = batches(trainer, packed, n=1, size=7)[0]
    a, b = split_batch(batch, trainer.task.tgt_dict.pad())
    assert a["nsentences"] == 3 and b["nsentences"] == 4
    assert a["ntokens"] + b["ntokens"] == batch["ntokens"]
    assert torch.equal(torch.cat([a["id"], b["id"]]), batch["id"])
    for half in (a, b):  # no column is padding in all rows
        assert half["net_input"]["src_tokens"].ne(1).any(0).all() and half["target"].ne(1).any(0).all()


def test_an_oom_splits_the_batch_and_keeps_the_update(databin, tmp_path, caplog, monkeypatch):  # noqa: F811
    flags = (
        "--dropout",
        "0",
        "--update-freq",
        "2",
        "--optimizer",
        "sgd",
        "--lr",
        "0.5",
    )  # (Adam divides by |g|)
    plain = build_trainer(databin, str(tmp_path / "a"), *flags)
    split = build_trainer(databin, str(tmp_path / "b"), *flags)
    split.model.load_state_dict(plain.model.state_dict())
    samples = batches(plain, packed=False, n=2, size=8)
    want = plain.train_step(samples)
    seen = oom_above(split, 3, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="seqtrain.trainer"):
        got = split.train_step(samples)
    # 8 -> 4 + 4 -> 2 + 2 + 2 + 2, for both batches of the update, each restart replaying the ones before
    assert [s for s in seen if s <= 3][-8:] == [2, 2, 2, 2, 2, 2, 2, 2]
    assert "out of memory in update 1; splitting batch 1's 8 examples in two" in caplog.text
    assert got is not None and got["sample_size"] == want["sample_size"]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    for (name, p), q in zip(plain.model.named_parameters(), split.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)
    assert split.meters["train"]["oom_split"].sum == 6 and "oom" not in split.meters["train"]


def test_one_example_that_does_not_fit_skips_the_update(databin, tmp_path, caplog, monkeypatch):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path), "--dropout", "0")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    oom_above(trainer, 0, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="seqtrain.trainer"):
        assert trainer.train_step(batches(trainer, packed=False, n=1, size=2)) is None
    assert "skipping this update" in caplog.text and trainer.meters["train"]["oom"].sum == 1
    assert trainer.get_num_updates() == 0
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
