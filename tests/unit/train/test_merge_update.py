"""--merge-max-tokens: an update's --update-freq batches run as one forward/backward pass give the update that
accumulating them gives (the same examples and sample_size; parameters equal up to summation order: fp64 to
1e-12, fp32 to 1e-6, dropout 0), and the same logged figures."""

from __future__ import annotations

import pytest
import torch

from seqtrain.data.pair_dataset import padded_shape
from seqtrain.flags import parsing, training
from seqtrain.tasks import setup_task
from seqtrain.train import loop as train_loop
from seqtrain.train.program import train_config
from seqtrain.train.trainer import Trainer


def build_trainer(data: str, save_dir: str) -> Trainer:
    argv = [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--optimizer",
        "sgd",  # the update is the gradient itself (Adam's first step would turn rounding noise into +-lr)
        "--lr",
        "0.5",
        "--max-tokens",
        "128",
        "--update-freq",
        "3",
        "--save-dir",
        save_dir,
        "--log-format",
        "none",
    ]
    cfg = train_config(parsing.parse_args_and_arch(training.get_training_parser(), argv))
    task = setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(0)
    return train_loop.build_trainer(
        cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    )


def _passes(trainer: Trainer) -> list[int]:
    """Records the rows of each forward/backward pass the task runs."""
    rows, real = [], trainer.task.train_step

    def counted(sample, *args, **kwargs):
        rows.append(sample["target"].size(0))
        return real(sample, *args, **kwargs)

    trainer.task.train_step = counted
    return rows


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_one_merged_pass_gives_the_accumulated_update(databin, tmp_path, dtype, atol):
    accumulated, merged = (
        build_trainer(databin, str(tmp_path / "a")),
        build_trainer(databin, str(tmp_path / "b")),
    )
    for t in (accumulated, merged):
        t.model.to(dtype)
    start = {k: v.clone() for k, v in accumulated.model.state_dict().items()}
    for k, v in merged.model.state_dict().items():
        assert torch.equal(v, start[k])
    dataset = accumulated.task.dataset("train")
    itr = accumulated.task.get_batch_iterator(dataset, max_tokens=128).next_epoch_itr(shuffle=True)
    batches = [next(itr) for _ in range(3)]
    widths = [padded_shape(b)[1] for b in batches]
    assert len(set(widths)) > 1  # batches of other lengths: the merged one pads the narrower ones up
    passes = dataset.merge_update(batches, max_tokens=10_000)
    assert len(passes) == 1 and passes[0]["nsentences"] == sum(b["nsentences"] for b in batches)
    layout = passes[0]["net_input"]["layout"]  # the model runs the merged batch packed, on its real tokens
    assert layout["src_cu_seqlens"].numel() == passes[0]["nsentences"] + 1

    rows_a, rows_b = _passes(accumulated), _passes(merged)
    stats_a = accumulated.train_step(batches)
    stats_b = merged.train_step(passes)
    assert rows_a == [b["nsentences"] for b in batches] and rows_b == [sum(rows_a)]

    for key in ("sample_size", "ntokens", "nsentences"):
        assert stats_a[key] == stats_b[key], key
    for key in ("loss", "nll_loss", "gnorm"):
        assert stats_b[key] == pytest.approx(stats_a[key], rel=atol), key
    moved = 0.0
    for k, v in merged.model.state_dict().items():
        torch.testing.assert_close(v, accumulated.model.state_dict()[k], rtol=atol, atol=atol, msg=k)
        moved = max(moved, float((v - start[k]).abs().max()))
    assert moved > 1e-3  # the update did move the weights
