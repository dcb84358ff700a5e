"""seqtrain-train --max-tokens auto end to end on the CPU, its probe answered by a stand-in for device memory (5
rows of the longest examples fit): the chosen budget is logged and stored, the relaunched run takes it without
probing, and the result is bitwise the run a fixed --max-tokens of that value gives."""

from __future__ import annotations

import logging
import os

import pytest

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.flags.parsers import UsageError
from seqtrain.train import auto_tokens
from seqtrain_cli.train import train_main
from tests.utils import assert_same_state, base_args

pytestmark = pytest.mark.slow


def auto_args(data: str, save_dir: str, *extra: str) -> list[str]:
    """base_args with --max-tokens auto instead of 512 (the last --max-tokens wins)."""
    return base_args(data, save_dir, "--max-tokens", "auto", "--no-epoch-checkpoints", *extra)


@pytest.fixture
def five_rows_fit(monkeypatch) -> list[tuple[int, int]]:
    """Replace the device-memory probe: a batch fits with at most 5 rows. Returns (rows, longest) per probe."""
    probes: list[tuple[int, int]] = []

    def fits(trainer, sample) -> bool:
        lengths = sample["net_input"]["src_lengths"].max(), sample["target"].ne(1).sum(1).max()
        probes.append((sample["nsentences"], int(max(lengths))))
        return sample["nsentences"] <= 5

    monkeypatch.setattr(auto_tokens, "probe_fits", fits)
    return probes


def test_the_choice_is_stored_and_a_resume_reuses_it(databin, tmp_path, five_rows_fit, caplog):
    save = str(tmp_path / "auto")
    with caplog.at_level(logging.INFO, logger="seqtrain.train"):
        assert train_main(auto_args(databin, save, "--max-update", "3")) == 0
    rows = [r for r, _ in five_rows_fit]
    assert rows[0] > 5 and rows[-1] == 5 and 5 in rows and 6 in rows  # halved, then bisected up to 5
    longest = five_rows_fit[0][1]
    want = 5 * longest
    assert f"--max-tokens auto: chose {want} tokens per batch" in caplog.text
    first = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    assert first["extra_state"]["auto_max_tokens"] == want and first["args"]["max_tokens"] == want
    five_rows_fit.clear()
    assert train_main(auto_args(databin, save, "--max-update", "6")) == 0
    assert five_rows_fit == []  # never probed again
    resumed = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))
    assert resumed["extra_state"]["auto_max_tokens"] == want
    fixed = str(tmp_path / "fixed")
    argv = base_args(databin, fixed, "--max-tokens", str(want), "--no-epoch-checkpoints", "--max-update", "6")
    assert train_main(argv) == 0
    unbroken = load_checkpoint_file(os.path.join(fixed, "checkpoint_last.pt"))
    assert resumed["extra_state"]["num_updates"] == unbroken["extra_state"]["num_updates"] == 6
    assert_same_state(resumed, unbroken)


def test_bad_values_and_the_cpu_are_one_line(databin, tmp_path):
    with pytest.raises(UsageError, match="--max-tokens: expected a number of tokens or auto, got 'lots'"):
        train_main(base_args(databin, str(tmp_path / "a"), "--max-tokens", "lots"))
    with pytest.raises(SeqtrainError, match="on the CPU give a number"):
        train_main(auto_args(databin, str(tmp_path / "b"), "--max-update", "1"))
