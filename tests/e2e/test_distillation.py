"""Word-level distillation through seqtrain-train on the toy data-bin: a student made from the teacher with
--decoder-layers-to-keep trains with --criterion label_smoothed_cross_entropy_with_distillation, its checkpoint
holds the student alone, and a resumed run (the teacher read again from --teacher-path) equals the unbroken one."""

from __future__ import annotations

import os

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain_cli.train import train_main
from tests.utils import base_args, parse_log

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
    log = str(tmp_path / "train.log")
    logging = ("--log-format", "simple", "--log-file", log, "--log-interval", "1")
    assert train_main(student_args(data, path, unbroken, 6, *logging)) == 0
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
    # the KD term is logged beside the loss, in training and validation, and is part of it
    for tag in ("train", "valid"):
        rows = parse_log(log, tag)
        assert rows and all(0 < r["distill_loss"] and r["nll_loss"] > 0 for r in rows), rows
    # the student generates as any checkpoint does (one decoder layer)
    from seqtrain_cli.generate import generate_main

    argv = [data, "--path", os.path.join(unbroken, "checkpoint_last.pt"), "--gen-subset", "valid", "--cpu"]
    gen = str(tmp_path / "gen")
    generate_main([*argv, "--beam", "2", "--results-path", gen], out=open(os.devnull, "w"))
    assert len(open(f"{gen}/hypotheses-valid.txt", encoding="utf-8").read().splitlines()) == 40
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


def test_sequence_level_kd_commands_of_the_docs(teacher, tmp_path):
    """docs/training.md's sequence-level KD: the teacher's beam outputs on train (hypotheses-train.txt, input
    order) become the target side of a new data-bin with the teacher's dictionary, on which a student trains."""
    import shutil

    from seqtrain.data.dictionary import Dictionary
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.preprocess import preprocess_main

    data, path = teacher
    raw, out, kd = os.path.join(os.path.dirname(data), "raw"), str(tmp_path / "gen"), tmp_path / "kd"
    argv = [data, "--path", path, "--gen-subset", "train", "--beam", "4", "--cpu", "--batch-size", "64"]
    generate_main([*argv, "--results-path", out], out=open(os.devnull, "w"))
    kd.mkdir()
    shutil.copy(f"{raw}/train.src", kd / "train.src")
    shutil.copy(f"{out}/hypotheses-train.txt", kd / "train.tgt")
    for side in ("src", "tgt"):
        shutil.copy(f"{raw}/valid.{side}", kd / f"valid.{side}")
    kd_bin = str(tmp_path / "kd-bin")
    preprocess_main(
        [
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--trainpref",
            f"{kd}/train",
            "--validpref",
            f"{kd}/valid",
            "--destdir",
            kd_bin,
            "--joined-dictionary",
            "--srcdict",
            f"{data}/dict.src.txt",
            "--tokenizer",
            "none",
            "--no-progress-bar",
        ]  # fmt: skip
    )
    for name in ("dict.src.txt", "dict.tgt.txt"):
        assert open(f"{kd_bin}/{name}").read() == open(f"{data}/{name}").read()
    hyps = open(f"{out}/hypotheses-train.txt", encoding="utf-8").read().splitlines()
    refs = open(f"{raw}/train.tgt", encoding="utf-8").read().splitlines()
    assert len(hyps) == len(refs) == 200 and hyps != refs
    d = Dictionary.load(f"{data}/dict.tgt.txt")
    targets = MMapIndexedDataset(f"{kd_bin}/train.src-tgt.tgt")
    assert [d.string(targets[i][:-1]) for i in range(len(hyps))] == hyps
    save = str(tmp_path / "student")
    argv = base_args(kd_bin, save, "--finetune-from-model", path, "--decoder-layers-to-keep", "1")
    assert train_main([*argv, "--max-update", "2", "--no-epoch-checkpoints"]) == 0
    assert load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 2
