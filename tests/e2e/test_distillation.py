"""Word-level distillation through seqtrain-train on the toy data-bin: a student made from the teacher with
--decoder-layers-to-keep trains with --criterion label_smoothed_cross_entropy_with_distillation, its checkpoint
holds the student alone, and a resumed run (the teacher read again from --teacher-path) equals the unbroken one."""

from __future__ import annotations

import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain_cli.train import train_main
from tests.utils import base_args

pytestmark = pytest.mark.slow

KD = "label_smoothed_cross_entropy_with_distillation"


@pytest.fixture(scope="module")
def teacher(toy_databin, tmp_path_factory):
    data = toy_databin()
    save = str(tmp_path_factory.mktemp("teacher"))
    assert train_main(base_args(data, save, "--max-update", "8", "--no-epoch-checkpoints")) == 0
    return data, os.path.join(save, "checkpoint_last.pt")


def student_args(data: str, teacher: str, save: str, updates: int, *extra: str) -> list:
    return base_args(
        data,
        save,
        "--finetune-from-model",
        teacher,
        "--decoder-layers-to-keep",
        "1",
        "--criterion",
        KD,
        "--teacher-path",
        teacher,
        "--label-smoothing",
        "0.1",
        "--max-update",
        str(updates),
        "--no-epoch-checkpoints",
        *extra,
    )


def test_student_trains_holds_itself_only_and_resumes_exactly(teacher, tmp_path):
    data, path = teacher
    unbroken, resumed = str(tmp_path / "unbroken"), str(tmp_path / "resumed")
    assert train_main(student_args(data, path, unbroken, 6)) == 0
    assert train_main(student_args(data, path, resumed, 3)) == 0
    assert train_main(student_args(data, path, resumed, 6)) == 0
    a = load_checkpoint_file(os.path.join(unbroken, "checkpoint_last.pt"))
    b = load_checkpoint_file(os.path.join(resumed, "checkpoint_last.pt"))
    t = load_checkpoint_file(path)["model"]
    assert a["extra_state"]["num_updates"] == b["extra_state"]["num_updates"] == 6
    # the student: the teacher's 2 decoder layers cut to 1 (layer 1, renumbered 0); no teacher weights in it
    assert any(k.startswith("decoder.layers.0.") for k in a["model"])
    assert not any(k.startswith("decoder.layers.1.") or "teacher" in k for k in a["model"])
    assert sorted(a["model"]) == sorted(k for k in t if not k.startswith("decoder.layers.1."))
    for k, v in a["model"].items():
        assert torch.equal(b["model"][k], v), k
    # it trained: the weights moved from the teacher's layer it started from
    assert not torch.equal(a["model"]["decoder.layers.0.fc1.weight"], t["decoder.layers.1.fc1.weight"])


def test_distillation_changes_the_updates_and_alpha_zero_is_label_smoothing(teacher, tmp_path):
    """alpha 0 trains exactly as --criterion label_smoothed_cross_entropy; alpha 0.8 differently."""
    data, path = teacher
    runs = {}
    for name, extra in (
        ("alpha0", ("--distill-alpha", "0")),
        ("alpha08", ("--distill-alpha", "0.8")),
        ("plain", ("--criterion", "label_smoothed_cross_entropy")),
    ):
        save = str(tmp_path / name)
        argv = student_args(data, path, save, 3, *extra)
        if name == "plain":
            i = argv.index("--teacher-path")
            del argv[i : i + 2]
        assert train_main(argv) == 0
        runs[name] = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))["model"]
    for k, v in runs["plain"].items():
        torch.testing.assert_close(runs["alpha0"][k], v, rtol=1.3e-6, atol=1e-5)
    assert not torch.equal(
        runs["alpha08"]["decoder.layers.0.fc1.weight"], runs["plain"]["decoder.layers.0.fc1.weight"]
    )
