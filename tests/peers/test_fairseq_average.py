"""seqtrain-average-checkpoints against fairseq 0.12's own scripts/average_checkpoints.py, on fairseq checkpoints.

fairseq's pip package does not ship its scripts/ folder, so the test runs the script from a fairseq source
checkout: $FAIRSEQ_SRC (a git clone of facebookresearch/fairseq; the script is taken at tag v0.12.2, or from the
working tree when the tag is absent), with the peer venv's interpreter ($FAIRSEQ_VENV, else
~/.cache/seqtrain-peers/fairseq). Skipped without either.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
SRC = os.environ.get("FAIRSEQ_SRC")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "python").exists() or not SRC,
        reason=f"needs fairseq 0.12 at {VENV} (../shared/tools/fairseq-peer.sh) and FAIRSEQ_SRC, a fairseq "
        "source checkout holding scripts/average_checkpoints.py",
    ),
]


def fairseq_script(tmp_path) -> str:
    shown = subprocess.run(
        ["git", "-C", SRC, "show", "v0.12.2:scripts/average_checkpoints.py"], capture_output=True, text=True
    )
    path = tmp_path / "average_checkpoints.py"
    if shown.returncode == 0:
        path.write_text(shown.stdout)
        return str(path)
    return os.path.join(SRC, "scripts", "average_checkpoints.py")


def test_same_average_as_fairseqs_script(fairseq_tiny, tmp_path):
    base = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"), unsafe=True)
    # three checkpoints of one model: fairseq's own, and two with every float weight moved by a seeded draw
    save = tmp_path / "run"
    save.mkdir()
    for epoch in (1, 2, 3):
        state = dict(base)
        gen = torch.Generator().manual_seed(epoch)
        state["model"] = {
            k: (v + 0.01 * (epoch - 1) * torch.randn(v.shape, generator=gen, dtype=v.dtype))
            if v.is_floating_point()
            else v.clone()
            for k, v in base["model"].items()
        }
        save_checkpoint_file(state, str(save / f"checkpoint{epoch}.pt"))
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    flags = ["--inputs", str(save), "--num-epoch-checkpoints", "3", "--checkpoint-upper-bound", "3"]
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    done = subprocess.run(
        [str(VENV / "bin" / "python"), fairseq_script(tmp_path), *flags, "--output", str(theirs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqtrain_cli.average_checkpoints",
            *flags,
            "--output",
            str(ours),
            "--unsafe-load",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    a = load_checkpoint_file(str(ours), unsafe=True)["model"]
    b = load_checkpoint_file(str(theirs), unsafe=True)["model"]
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
