"""What a run says at start, while it runs and where it ended (issue 41): a quiet start (no Namespace dump, the
model in one line), a line after the first update with the time to --max-update, progress lines that end with
the time left, the bf16-on-this-CPU warning, and at the end the best checkpoint with the command that
summarizes with it, which works as printed."""

from __future__ import annotations

import re
import shlex

import pytest
import torch

from seqtrain import host_cpu
from seqtrain_cli.generate import generate_main
from seqtrain_cli.train import train_main
from tests.utils import base_args


def test_start_progress_and_end_lines(databin, tmp_path, monkeypatch):
    monkeypatch.setattr(host_cpu, "cpu_has_bf16", lambda: False)  # the same lines on any CPU
    save, log = tmp_path / "ck", tmp_path / "train.log"
    flags = ["--max-update", "6", "--log-format", "simple", "--log-interval", "2", "--log-file", str(log)]
    assert train_main(base_args(databin, str(save), *flags, "--bf16")) == 0
    text = log.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert all(
        re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| ", line) for line in lines
    )  # one line each
    assert "Namespace(" not in text and "BARTModel(" not in text and len(text) < 8000
    assert (
        f"training bart_tiny on {databin}; all flags: {save}/config.yaml (--print-config prints them)" in text
    )
    assert "| model: BARTModel, 2+2 layers, 64 dims (FFN 128, 4 heads), dictionary 40 symbols\n" in text
    assert "| WARNING | seqtrain.train | --bf16 on a CPU without bf16 instructions" in text
    assert re.search(r"update 1 done in [\d.]+ s .*--max-update 6 \(6 updates\) is reached in \d+s", text)
    inner = [line for line in lines if " | train_inner | " in line]
    assert len(inner) == 3 and all(
        re.search(r"epoch 00\d: +\d / 4 \(eta \d+s\) loss=", line) for line in inner
    )
    assert "/ 4 (eta 0s) loss=" in inner[-1]
    # every key=value is still a number (scripts that read the lines that way keep working)
    assert all(float(v) == float(v) for line in inner for v in re.findall(r"\w+=([^,]+)", line))

    best = torch.load(save / "checkpoint_best.pt", weights_only=True)
    score, update = best["extra_state"]["best"], best["extra_state"]["train_iterator"]
    (end,) = [line.split(" | ", 3)[3] for line in lines if "best checkpoint:" in line]
    assert end == f"best checkpoint: {save}/checkpoint_best.pt (loss {score:g}, update 6, epoch 2)"
    # the rule that chose it, and what ended training (a validation at each of the 2 epochs' ends: the 6th
    # update ends epoch 2)
    assert lines[lines.index(next(line for line in lines if "best checkpoint:" in line)) + 1].endswith(
        "| checkpoint_best.pt holds the lowest validation loss (--best-checkpoint-metric loss) on 'valid', "
        "validated every epoch (2 validations in this launch); training ended at --max-update 6"
    )
    (cmd,) = [
        line.split(": ", 1)[1]
        for line in lines
        if "summarize the valid split with it:" in line.split(" | ")[3]
    ]
    argv = shlex.split(cmd)
    assert argv[0] == "seqtrain-generate" and "--path" in argv and update["epoch"] == 2
    generate_main(argv[1:] + ["--quiet"])  # as printed
    hyps = (save / "gen" / "hypotheses-valid.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 40 and all(hyps)


def test_a_wrong_data_path_leaves_no_empty_save_dir(databin, tmp_path):
    from seqtrain.errors import SeqtrainError

    save = tmp_path / "ck"
    empty = tmp_path / "empty"
    empty.mkdir()
    for data in (tmp_path / "nowhere", empty):
        try:
            train_main(base_args(str(data), str(save), "--max-update", "1"))
        except SeqtrainError as e:
            assert str(data) in str(e)
        else:
            raise AssertionError("trained on a wrong DATA")
        assert not save.exists()
    save.mkdir()  # a folder the user made stays
    (save / "notes.txt").write_text("mine")
    try:
        train_main(base_args(str(empty), str(save), "--max-update", "1"))
    except SeqtrainError:
        pass
    assert sorted(p.name for p in save.iterdir()) == ["notes.txt"]


def test_an_interrupted_epoch_adds_no_tensorboard_point(databin, tmp_path):
    """4 updates an epoch: a launch stopped by --max-update 6 in the middle of epoch 2, then resumed to 8. The
    epoch series holds one point per epoch (updates 4 and 8), not the stopped half (6); the log keeps its line."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb, save, log = tmp_path / "tb", str(tmp_path / "ck"), tmp_path / "train.log"
    flags = ["--tensorboard-logdir", str(tb), "--log-format", "simple", "--log-file", str(log)]
    assert train_main(base_args(databin, save, "--max-update", "6", *flags)) == 0
    assert train_main(base_args(databin, save, "--max-update", "8", *flags)) == 0
    acc = EventAccumulator(str(tb / "train"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [4, 8]
    epoch_lines = [line for line in log.read_text().splitlines() if " | train | epoch " in line]
    assert [re.search(r"num_updates (\d+)", line).group(1) for line in epoch_lines] == ["4", "6", "8"]
    acc = EventAccumulator(str(tb / "valid"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [4, 6, 8]  # validations are points in time: all kept


@pytest.mark.slow
def test_the_end_names_the_rouge_rule_and_the_patience_stop(databin, tmp_path):
    """configs/debdesc_finetune.yaml's rules on the toy task: checkpoint_best.pt by validation ROUGE, training
    ended by --patience (a learning rate too small to change ROUGE: the second validation is no better)."""
    save, log = tmp_path / "ck", tmp_path / "train.log"
    flags = [
        "--max-epoch",
        "30",
        "--patience",
        "1",
        "--eval-rouge",
        "--eval-rouge-args",
        "--beam 1 --max-len-b 5",
    ]
    flags += ["--best-checkpoint-metric", "rouge_l", "--maximize-best-checkpoint-metric", "--lr", "1e-9"]
    assert (
        train_main(base_args(databin, str(save), *flags, "--log-format", "simple", "--log-file", str(log)))
        == 0
    )
    lines = [line.split(" | ", 3)[3] for line in log.read_text(encoding="utf-8").splitlines()]
    best = next(i for i, line in enumerate(lines) if line.startswith("best checkpoint:"))
    assert lines[best].startswith(f"best checkpoint: {save}/checkpoint_best.pt (rouge_l ")
    assert lines[best].endswith(", update 8, epoch 2)")  # a tie counts as better (fairseq's rule)
    assert lines[best + 1] == (
        "checkpoint_best.pt holds the highest validation rouge_l (--best-checkpoint-metric rouge_l "
        "--maximize-best-checkpoint-metric) on 'valid', validated every epoch (2 validations in this launch); "
        "training ended at --patience 1 (1 validation without a better rouge_l)"
    )
