"""--max-tokens auto: the probe halves and bisects the rows of the longest batch until it fits (an out-of-memory
error injected on the CPU as tests/unit/train/test_oom_split.py does), leaves the training state as it was, and a
resumed trainer takes the stored budget without probing again."""

from __future__ import annotations

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.train.auto_tokens import choose_max_tokens, longest_first
from seqtrain.train.loop import batch_budget
from seqtrain.train.program import run_record
from tests.unit.train.test_oom_split import oom_above
from tests.unit.train.test_sync_free import build, build_trainer, databin  # noqa: F401 (databin: a fixture)

POSITIONS = (1024, 1024)


def longest(trainer) -> int:
    dataset = trainer.task.dataset("train")
    return dataset.num_tokens(int(longest_first(dataset, POSITIONS)[0]))


def test_rows_halve_then_bisect_to_the_largest_batch_that_fits(databin, tmp_path, monkeypatch):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path), "--dropout", "0")
    seen = oom_above(trainer, 3, monkeypatch)
    chosen = choose_max_tokens(trainer, trainer.task.dataset("train"), POSITIONS, start=64 * longest(trainer))
    assert seen == [64, 32, 16, 8, 4, 2, 3]  # 64 examples in the data-bin; 4 rows and more run out of memory
    assert chosen == 3 * longest(trainer)


def test_rows_stay_a_multiple_of_required_batch_size_multiple(databin, tmp_path, monkeypatch):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path))
    seen = oom_above(trainer, 5, monkeypatch)
    chosen = choose_max_tokens(trainer, trainer.task.dataset("train"), POSITIONS, multiple=2, start=10**6)
    assert seen == [64, 32, 16, 8, 4, 6]  # 5 rows would fit, but batching would make 4 of them
    assert chosen == 4 * longest(trainer)


def test_the_probe_leaves_weights_gradients_and_rng_as_they_were(databin, tmp_path, monkeypatch):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    oom_above(trainer, 7, monkeypatch)
    rng = torch.get_rng_state()
    choose_max_tokens(trainer, trainer.task.dataset("train"), POSITIONS, start=10**6)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    assert all(p.grad is None or not p.grad.any() for p in trainer.model.parameters())
    assert trainer.get_num_updates() == 0 and not trainer.optimizer.optimizer.state


def test_one_example_that_does_not_fit_is_one_line(databin, tmp_path, monkeypatch):  # noqa: F811
    trainer = build_trainer(databin, str(tmp_path))
    oom_above(trainer, 0, monkeypatch)
    with pytest.raises(SeqtrainError, match=r"one example of the longest length \(\d+ tokens\) does not fit"):
        choose_max_tokens(trainer, trainer.task.dataset("train"), POSITIONS)


def test_resume_takes_the_stored_budget_and_never_probes(databin, tmp_path, monkeypatch):  # noqa: F811
    first_cfg, first = build(databin, str(tmp_path / "a"), "--max-tokens", "auto")
    oom_above(first, 3, monkeypatch)
    batch_budget(first_cfg, first, first.task.dataset("train"), POSITIONS)
    want = 3 * longest(first)
    assert first_cfg.data.max_tokens == first_cfg.data.max_tokens_valid == want  # the loop batches with it
    first.run_args = run_record(first_cfg)  # what the loop hands the trainer once set-up is done
    state = first.state_dict()
    assert state["extra_state"]["auto_max_tokens"] == want and state["args"]["max_tokens"] == want
    assert state["args"]["max_tokens_valid"] == want
    cfg, resumed = build(databin, str(tmp_path / "b"), "--max-tokens", "auto")
    assert cfg.data.max_tokens == "auto"
    seen = oom_above(resumed, 1, monkeypatch)  # a probe now would choose 1 row
    resumed.load_state_dict(state, "checkpoint_last.pt")
    batch_budget(cfg, resumed, resumed.task.dataset("train"), POSITIONS)
    assert seen == [] and cfg.data.max_tokens == cfg.data.max_tokens_valid == want
    assert run_record(cfg)["max_tokens"] == want
    assert resumed.state_dict()["extra_state"]["auto_max_tokens"] == want  # and the next save keeps it


def test_the_cpu_is_refused(databin, tmp_path):  # noqa: F811
    cfg, trainer = build(databin, str(tmp_path), "--max-tokens", "auto")
    with pytest.raises(
        SeqtrainError, match="only a CUDA device reports running out of; on the CPU give a number"
    ):
        batch_budget(cfg, trainer, trainer.task.dataset("train"), POSITIONS)
