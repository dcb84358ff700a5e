"""--deterministic on the CPU (deterministic algorithms apply to CPU operators too): a tiny BART trained twice from
the same start is bitwise equal, and a run saved mid-epoch and resumed equals the unbroken one, with every
operator of the step running under use_deterministic_algorithms(True, warn_only=False). The GPU side of the
claim (bart_base at real lengths, the cost) is scripts/gpu/stage_determinism.py. The refusals (an operator
without a deterministic kernel, a cuBLAS setting, --cudnn-attention) are in tests/e2e/test_bad_input.py."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.cuda import CUBLAS_VAR
from seqtrain_cli.train import train_main
from tests.utils import assert_same_state


def args_for(data: str, save_dir: str, *extra: str) -> list:
    # dropout 0.1 and label smoothing as tests/e2e/test_resume.py; 4 updates an epoch
    return [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
        "--deterministic",
        "--lr",
        "3e-3",
        "--max-tokens",
        "512",
        "--log-format",
        "none",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--seed",
        "3",
        "--max-update",
        "6",
        "--save-interval-updates",
        "3",
        "--save-dir",
        save_dir,
        *extra,
    ]


@pytest.mark.slow
def test_two_runs_and_a_resume_are_bitwise_equal(databin, tmp_path, monkeypatch):
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    runs = [str(tmp_path / name) for name in ("first", "second")]
    for save_dir in runs:
        train_main(args_for(databin, save_dir))
        # the flag's settings, process-wide (restored after the test by conftest's fixture)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ[CUBLAS_VAR] == ":4096:8"
    a, b = (load_checkpoint_file(os.path.join(r, "checkpoint_last.pt")) for r in runs)
    assert a["extra_state"]["num_updates"] == 6
    assert a["args"]["deterministic"] is True
    assert_same_state(a, b)

    # saved after update 3 (mid-epoch 1), resumed to 6 with the same command
    start = os.path.join(runs[0], "checkpoint_1_3.pt")
    assert load_checkpoint_file(start)["extra_state"]["num_updates"] == 3
    resumed = str(tmp_path / "resumed")
    os.makedirs(resumed)
    shutil.copy(start, os.path.join(resumed, "checkpoint_last.pt"))
    train_main(args_for(databin, resumed))
    c = load_checkpoint_file(os.path.join(resumed, "checkpoint_last.pt"))
    assert not torch.equal(
        c["model"]["encoder.layers.0.fc1.weight"],
        load_checkpoint_file(start)["model"]["encoder.layers.0.fc1.weight"],
    )
    assert_same_state(a, c)
