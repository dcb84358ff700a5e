"""Exact resume (bitwise on CPU, dropout on) and the --reset-* / --finetune-from-model / --restore-file rules."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, training
from seqtrain.tasks import setup_task
from seqtrain.train import loop as train_loop
from seqtrain.train.program import train_config
from seqtrain.train.trainer import Trainer
from seqtrain_cli.train import train_main
from tests.utils import assert_same_state


def args_for(data: str, save_dir: str, *extra: str) -> list:
    # dropout 0.1 (bart_tiny's default) and label smoothing: resume must restore the RNG stream, not only weights
    return [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
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
        "7",
        "--save-dir",
        save_dir,
        *extra,
    ]


SCHEDULES = {
    "inverse_sqrt": [
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "3",
        "--max-update",
        "10",
        "--save-interval-updates",
        "3",
    ],
    # polynomial_decay resets the lr at each epoch start: a resumed run must step it back by the update count
    "freq2": [
        "--lr-scheduler",
        "polynomial_decay",
        "--warmup-updates",
        "2",
        "--total-num-update",
        "8",
        "--max-update",
        "6",
        "--save-interval-updates",
        "1",
        "--update-freq",
        "2",
    ],
}
# the same with both batches of an update run as one pass (--merge-max-tokens): the merge is decided from the
# batches' shapes, so a resumed run merges, and draws its dropout masks, as the unbroken one
SCHEDULES["freq2-merged"] = [*SCHEDULES["freq2"], "--merge-max-tokens", "4096"]
# fairseq's --bf16 (a bf16 model over fp32 master weights): checkpoints hold the masters, so resume is exact
SCHEDULES["bf16-fairseq"] = [*SCHEDULES["freq2"], "--bf16", "--bf16-mode", "fairseq", "--clip-norm", "0.5"]


@pytest.fixture(scope="module")
def full_runs(databin, tmp_path_factory):
    """Uninterrupted runs whose interval and epoch checkpoints serve as the points to resume from."""
    root = tmp_path_factory.mktemp("full")
    out = {}
    for name, flags in SCHEDULES.items():
        save_dir = str(root / name)
        train_main(args_for(databin, save_dir, *flags))
        out[name] = save_dir
    return out


@pytest.mark.parametrize(
    "schedule,resume_from,at,drop_rng",
    [
        ("inverse_sqrt", "checkpoint_2_6.pt", (2, 2), False),  # mid-epoch: 2 of epoch 2's 4 batches done
        ("inverse_sqrt", "checkpoint1.pt", (2, 0), False),  # end of epoch 1: resumes at the start of epoch 2
        ("freq2", "checkpoint_2_3.pt", (2, 2), False),  # --update-freq 2, one update into epoch 2
        # without the saved RNG states: dropout is seeded from (seed, update number), so the run is still exact
        ("freq2", "checkpoint_2_3.pt", (2, 2), True),
        ("freq2-merged", "checkpoint_2_3.pt", (2, 2), False),
        ("bf16-fairseq", "checkpoint_2_3.pt", (2, 2), False),
    ],
    ids=["mid-epoch", "epoch-end", "update-freq-2", "no-saved-rng", "merged-update", "bf16-fairseq"],
)
@pytest.mark.slow
def test_resume_is_bitwise_exact(databin, full_runs, tmp_path, schedule, resume_from, at, drop_rng):
    full = full_runs[schedule]
    start = load_checkpoint_file(os.path.join(full, resume_from))
    itr = start["extra_state"]["train_iterator"]
    assert (itr["epoch"], itr["iterations_in_epoch"]) == at
    resumed = str(tmp_path / "resumed")
    os.makedirs(resumed)
    shutil.copy(os.path.join(full, resume_from), os.path.join(resumed, "checkpoint_last.pt"))
    if drop_rng:
        del start["extra_state"]["rng"]
        torch.save(start, os.path.join(resumed, "checkpoint_last.pt"))
        torch.manual_seed(12345)  # whatever state the process is in
    train_main(args_for(databin, resumed, *SCHEDULES[schedule]))
    a = load_checkpoint_file(os.path.join(full, "checkpoint_last.pt"))
    b = load_checkpoint_file(os.path.join(resumed, "checkpoint_last.pt"))
    assert (
        b["extra_state"]["num_updates"] > start["extra_state"]["num_updates"]
    )  # it did train after resuming
    assert not torch.equal(
        b["model"]["encoder.layers.0.fc1.weight"], start["model"]["encoder.layers.0.fc1.weight"]
    )
    assert_same_state(a, b)
    if schedule == "bf16-fairseq":  # the fp32 masters, not the bf16 copy, are what was saved and resumed
        w = b["model"]["encoder.layers.0.fc1.weight"]
        assert w.dtype == torch.float32 and not torch.equal(w, w.to(torch.bfloat16).float())
    if schedule == "freq2-merged":  # the merge did change the run: one pass draws other dropout masks
        plain = load_checkpoint_file(os.path.join(full_runs["freq2"], "checkpoint_last.pt"))
        assert plain["extra_state"]["num_updates"] == b["extra_state"]["num_updates"]
        assert not torch.equal(
            plain["model"]["encoder.layers.0.fc1.weight"], b["model"]["encoder.layers.0.fc1.weight"]
        )


def build_trainer(data: str, save_dir: str, *extra: str) -> Trainer:
    cfg = train_config(
        parsing.parse_args_and_arch(training.get_training_parser(), args_for(data, save_dir, *extra))
    )
    task = setup_task(cfg.task)
    return train_loop.build_trainer(
        cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    )


@pytest.mark.parametrize("flag", ["", "reset_optimizer", "reset_lr_scheduler", "reset_meters"])
@pytest.mark.slow
def test_trainer_load_state_dict_reset_flags(databin, full_runs, tmp_path, flag):
    path = os.path.join(full_runs["inverse_sqrt"], "checkpoint_2_6.pt")
    state = load_checkpoint_file(path)
    state["lr_scheduler"]["best"] = 123.0  # a marker only a restored scheduler carries
    trainer = build_trainer(databin, str(tmp_path), *SCHEDULES["inverse_sqrt"])
    trainer.load_state_dict(state, path, **({flag: True} if flag else {}))
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, state["model"][k]), k  # weights always load
    opt_state = trainer.optimizer.state_dict()["state"]
    if flag == "reset_optimizer":
        # fairseq: a fresh optimizer also restarts the update count (and with it the lr schedule)
        assert trainer.get_num_updates() == 0 and opt_state == {}
        assert trainer.lr_scheduler.best is None
    else:
        assert trainer.get_num_updates() == 6
        assert int(opt_state[0]["step"]) == 6
        assert trainer.lr_scheduler.best == (None if flag == "reset_lr_scheduler" else 123.0)
        assert trainer.get_lr() == pytest.approx(3e-3 * 3**0.5 / 6**0.5)  # inverse_sqrt at update 6
    count = trainer.meters["train"].meters["bsz"].count if "bsz" in trainer.meters["train"] else 0
    assert count == (0 if flag in ("reset_meters",) else 2)  # 2 updates of epoch 2 were in the meters


@pytest.mark.slow
def test_reset_dataloader_and_meters_via_cli(databin, full_runs, tmp_path):
    src = os.path.join(full_runs["inverse_sqrt"], "checkpoint_2_6.pt")
    results = {}
    for flag in ("", "--reset-dataloader", "--reset-meters"):
        save_dir = str(tmp_path / (flag.strip("-") or "plain"))
        os.makedirs(save_dir)
        shutil.copy(src, os.path.join(save_dir, "checkpoint_last.pt"))
        extra = [flag] if flag else []
        train_main(
            args_for(
                databin,
                save_dir,
                "--lr-scheduler",
                "inverse_sqrt",
                "--warmup-updates",
                "3",
                "--max-update",
                "7",
                "--no-epoch-checkpoints",
                *extra,
            )
        )
        results[flag] = load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))["extra_state"]
    assert (
        results[""]["train_iterator"]["epoch"] == 2
        and results[""]["train_iterator"]["iterations_in_epoch"] == 3
    )
    # the data position restarts at epoch 1; the update count does not
    assert results["--reset-dataloader"]["train_iterator"]["epoch"] == 1
    assert results["--reset-dataloader"]["train_iterator"]["iterations_in_epoch"] == 1
    assert results["--reset-dataloader"]["num_updates"] == 7
    bsz = {f: r["meters"]["train"]["meters"]["bsz"]["count"] for f, r in results.items()}
    assert bsz == {"": 3, "--reset-dataloader": 3, "--reset-meters": 1}


@pytest.mark.slow
def test_finetune_from_model_only_on_first_launch(databin, full_runs, tmp_path):
    pretrained = os.path.join(full_runs["inverse_sqrt"], "checkpoint_2_6.pt")
    save_dir = str(tmp_path / "ft")
    # sgd with lr 0 leaves the weights as loaded, so they can be compared bitwise after one update
    ft = ["--optimizer", "sgd", "--lr", "0", "--max-update", "1", "--no-epoch-checkpoints"]
    train_main(args_for(databin, save_dir, "--finetune-from-model", pretrained, *ft))
    state = load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))
    source = load_checkpoint_file(pretrained)
    assert all(torch.equal(state["model"][k], source["model"][k]) for k in source["model"])
    itr = state["extra_state"]["train_iterator"]
    assert state["extra_state"]["num_updates"] == 1 and (itr["epoch"], itr["iterations_in_epoch"]) == (1, 1)
    # second launch: checkpoint_last.pt exists, so the run resumes and the (now missing) model is not read
    train_main(
        args_for(
            databin,
            save_dir,
            "--finetune-from-model",
            str(tmp_path / "gone.pt"),
            *ft[:-3],
            "--max-update",
            "2",
            "--no-epoch-checkpoints",
        )
    )
    assert (
        load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))["extra_state"]["num_updates"] == 2
    )

    with pytest.raises(SeqtrainError, match="--finetune-from-model .*gone.pt: file not found"):
        train_main(
            args_for(databin, str(tmp_path / "new"), "--finetune-from-model", str(tmp_path / "gone.pt"), *ft)
        )
    with pytest.raises(SeqtrainError, match="cannot be combined with --reset-optimizer"):
        train_main(
            args_for(
                databin, str(tmp_path / "new"), "--finetune-from-model", pretrained, "--reset-optimizer", *ft
            )
        )
    with pytest.raises(SeqtrainError, match="--restore-file .*nothere.pt: file not found"):
        train_main(
            args_for(databin, str(tmp_path / "new"), "--restore-file", str(tmp_path / "nothere.pt"), *ft)
        )


def test_restore_file_from_fairseq_checkpoint(fairseq_tiny, tmp_path):
    """fairseq's BART fine-tuning recipe: --restore-file a fairseq model with --reset-* flags loads its weights."""
    ft = [
        "--arch",
        "bart_base",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "128",
        "--decoder-embed-dim",
        "128",
        "--encoder-ffn-embed-dim",
        "512",
        "--decoder-ffn-embed-dim",
        "512",
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--optimizer",
        "sgd",
        "--lr",
        "0",
        "--max-tokens",
        "2048",
        "--max-update",
        "1",
        "--cpu",
        "--log-format",
        "none",
        "--disable-validation",
        "--restore-file",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
        "--save-dir",
        str(tmp_path),
        "--no-epoch-checkpoints",
    ]
    train_main([str(fairseq_tiny / "data-bin"), *ft])
    ours = load_checkpoint_file(str(tmp_path / "checkpoint_last.pt"))
    theirs = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"))["model"]
    for k, v in ours["model"].items():
        assert torch.equal(v, theirs[k]), k
    assert ours["extra_state"]["num_updates"] == 1


@pytest.mark.slow
def test_cuda_oom_skips_the_update(databin, full_runs, tmp_path, monkeypatch):
    """An out-of-memory error on CUDA that does not go away when the batch is split, down to one example,
    skips the update (gradients dropped, count unchanged); training goes on."""
    trainer = build_trainer(databin, str(tmp_path), *SCHEDULES["inverse_sqrt"])
    task = trainer.task
    task.load_dataset("train")
    batch = task.dataset("train").collater([task.dataset("train")[i] for i in range(8)])
    assert trainer.train_step([batch]) is not None and trainer.get_num_updates() == 1

    real_step = task.train_step

    def failing_step(sample, model, criterion, step, update_num, ignore_grad=False):
        real_step(sample, model, criterion, step, update_num, ignore_grad)  # gradients accumulate...
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB"
        )  # ...then it fails

    monkeypatch.setattr(trainer, "device", torch.device("cuda"))
    monkeypatch.setattr(trainer, "prepare_sample", lambda s: s)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(task, "train_step", failing_step)
    assert trainer.train_step([batch]) is None
    assert trainer.get_num_updates() == 1
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.meters["train"].smoothed_values()["oom"] == 1
    assert trainer.meters["train"]["oom_split"].sum == 3  # 8 -> 4 -> 2 -> one example, which fails too
    monkeypatch.setattr(task, "train_step", real_step)
    assert trainer.train_step([batch]) is not None and trainer.get_num_updates() == 2
    # on CPU the same error is not swallowed
    monkeypatch.setattr(trainer, "device", torch.device("cpu"))
    monkeypatch.setattr(task, "train_step", failing_step)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        trainer.train_step([batch])
