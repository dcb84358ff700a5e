"""The training state record (seqtrain/checkpoint/train_state.py): the dicts it writes are the on-disk layout
seqtrain and fairseq 0.12 always wrote, and what it reads it writes back unchanged."""

from __future__ import annotations

import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.checkpoint.train_state import TrainState

RUN_ORDER = [
    "epoch",
    "train_iterator",
    "val_loss",
    "checkpoint_manager",
    "best",
    "num_updates",
    "meters",
    "rng",
    "train_wall",
    "previous_training_time",
    "ema",
    "ema_counter",
    "ema_fp32_params",
    "auto_max_tokens",
]


def run_state(**more) -> TrainState:
    """A run's save before any validation, with the Trainer's fields filled in as Trainer.train_state does."""
    position = TrainState.at_save(
        2, {"epoch": 2, "iterations_in_epoch": 5, "shuffle": True}, None, {"best": None}, None
    )
    return position.replace(
        num_updates=17,
        meters={"train": {}, "train_inner": {}},
        rng={"torch": torch.get_rng_state()},
        train_wall=3.5,
        previous_training_time=3.5,
        optimizer={"state": {}, "param_groups": []},
        **more,
    )


def test_a_runs_save_is_laid_out_as_seqtrain_always_wrote_it():
    state = run_state().to_dict()
    assert list(state) == ["optimizer", "lr_scheduler", "loss_scaler", "extra_state"]
    extra = state["extra_state"]
    # before the first validation the run still says val_loss and best (None); no EMA, no auto budget
    assert list(extra) == RUN_ORDER[:10] and extra["val_loss"] is None and extra["best"] is None
    assert extra["num_updates"] == 17 and extra["train_iterator"]["iterations_in_epoch"] == 5
    ema = {"w": torch.ones(2)}
    full = run_state(
        ema=ema,
        ema_counter=1,
        ema_fp32_params=ema,
        auto_max_tokens=640,
        lora_base={"path": "/b.pt", "sha256": "0"},
    ).to_dict()
    assert list(full["extra_state"]) == RUN_ORDER and full["extra_state"]["auto_max_tokens"] == 640
    assert list(full)[-1] == "lora_base" and full["lora_base"]["path"] == "/b.pt"


def test_what_is_read_is_written_back_unchanged():
    for saved in (
        run_state(ema={"w": torch.ones(2)}, ema_counter=0).to_dict(),
        TrainState().to_dict(),  # a model export: no training state at all
        {
            "optimizer": None,
            "lr_scheduler": None,
            "loss_scaler": None,
            "extra_state": {"epoch": None, "x": [1]},
        },
    ):
        again = TrainState.from_dict(saved).to_dict()
        assert again == saved and list(again["extra_state"]) == list(saved["extra_state"])
    assert TrainState().to_dict()["extra_state"] == {}
    empty = TrainState.from_dict(None)
    assert empty == TrainState() and not empty.says("epoch")
    stored_none = TrainState.from_dict({"extra_state": {"best": None}})
    assert stored_none.says("best") and not stored_none.says("val_loss")


def test_averaging_keeps_all_but_the_optimizer_state():
    saved = run_state(loss_scaler={"loss_scale": 8.0}, lr_scheduler={"x": 1}).to_dict()
    out = TrainState.from_dict(saved).without_optimizer().to_dict()
    assert out["optimizer"] is None and out["lr_scheduler"] is None and out["loss_scaler"] is None
    assert out["extra_state"] == saved["extra_state"]


def test_fairseq_checkpoints_read_through_the_same_record(fairseq_tiny):
    """fairseq 0.12 wrote the extra_state dict first: its entries read as the same fields, the ones seqtrain does
    not know ("metrics") are kept, and an export writes fairseq's own layout back."""
    ck = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"), unsafe=True)
    state = TrainState.from_dict(ck)
    assert state.train_iterator["epoch"] == 19 and state.best == state.val_loss == ck["extra_state"]["best"]
    assert set(state.other) == {"metrics"} and state.optimizer is None and state.num_updates is None
    assert state.extra_state() == ck["extra_state"]
    assert state.fairseq_extra_state(state.best) == {
        "epoch": 19,
        "train_iterator": {"epoch": 19, "iterations_in_epoch": 12},
        "val_loss": ck["extra_state"]["val_loss"],
        "best": ck["extra_state"]["best"],
    }
    # fairseq compares `best` with the next validation's value: it is left out when there is none
    assert "best" not in TrainState().fairseq_extra_state(None)
