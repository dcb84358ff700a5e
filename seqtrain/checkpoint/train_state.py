"""The training state: what a checkpoint holds besides the weights, in one typed record, read and written here only.

A seqtrain checkpoint is {format, version, args, model, src_dict, tgt_dict, tokenizer} (seqtrain.checkpoint.native)
followed by the entries of `TrainState.to_dict()`:

    optimizer, lr_scheduler, loss_scaler    the optimizer's, the lr scheduler's and the fp16 loss scaler's state_dict
    extra_state: {                          fairseq's name for the rest (its keys are TrainState's fields):
        epoch, train_iterator                 the data position (EpochBatchIterator.state_dict())
        val_loss, checkpoint_manager, best    the last validation, the best value and --patience counter
        num_updates, meters                   the update count, the training meters (train, train_inner)
        rng                                   every global RNG state (seqtrain.train.trainer.rng_state)
        train_wall, previous_training_time    seconds of training so far
        ema, ema_counter, ema_fp32_params     --store-ema's shadow weights (fairseq's names; seqtrain.optim.ema)
        auto_max_tokens                       the budget --max-tokens auto chose at the first launch
        ...                                   any other key (fairseq 0.12's "metrics"), kept as read
    }
    lora_base                               --save-adapters-only: the base model file (seqtrain.checkpoint.adapters)

Writers: the Trainer (its own state) over the CheckpointManager's data position and validation record
(seqtrain.train.checkpoints); readers: resume, --ema-seed-model, seqtrain-convert (--ema, --to fairseq) and
seqtrain-average-checkpoints. fairseq 0.12 checkpoints carry the same extra_state dict (fairseq wrote it first), so
one record reads both; fairseq's own layout of an export is `fairseq_extra_state`.

The file format is what fairseq and older seqtrain versions wrote: an entry is written when it has a value, and a
record read from a file writes back exactly what it read (`to_dict(from_dict(d))` gives d's entries), including
entries stored as None: `says(key)` tells a stored None from an absent entry where readers tell them apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from seqtrain.checkpoint.adapters import BASE_KEY

TOP_LEVEL = ("optimizer", "lr_scheduler", "loss_scaler")  # always written (None without that state)
EXTRA_STATE = "extra_state"
# extra_state's entries in the order a training run writes them (the CheckpointManager's, then the Trainer's)
EXTRA_KEYS = (
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
)
# a run's checkpoint says these even before the first validation (None), as fairseq's does
_RUN_SAYS_NONE = frozenset({"val_loss", "best"})


# The training state's scalars a reader uses: (kind, lowest value), checked by seqtrain.checkpoint.checks before
# a resume reads them; --max-tokens auto's choice is a --max-tokens there too
SCALAR_KINDS = {
    "epoch": (int, 0),
    "num_updates": (int, 0),
    "ema_counter": (int, 0),
    "auto_max_tokens": (int, 1),
    "previous_training_time": (float, 0),
}


@dataclass
class TrainState:
    """What a checkpoint holds besides the weights. Every field is None when the checkpoint has no such entry."""

    optimizer: dict | None = None
    lr_scheduler: dict | None = None
    loss_scaler: dict | None = None
    # extra_state
    epoch: int | None = None
    train_iterator: dict | None = (
        None  # {"epoch", "iterations_in_epoch", "shuffle"}: where training continues
    )
    val_loss: float | None = None  # the --best-checkpoint-metric value of this save's validation
    checkpoint_manager: dict | None = None  # CheckpointManager.state_dict(): best value, --patience counter
    best: float | None = (
        None  # the best value so far (fairseq's key; older seqtrain checkpoints have only it)
    )
    num_updates: int | None = None
    meters: dict | None = None  # {"train", "train_inner"}: MetersDict.state_dict() of each
    rng: dict | None = None  # seqtrain.train.trainer.rng_state()
    train_wall: float | None = None
    previous_training_time: float | None = None
    ema: dict | None = None  # the EMA's shadow weights, in the model's dtype
    ema_counter: int | None = None
    ema_fp32_params: dict | None = None  # --ema-fp32: the fp32 shadow
    auto_max_tokens: int | None = None
    lora_base: dict | None = None  # {"path", "sha256"} of the base an adapters-only checkpoint is laid over
    other: dict[str, Any] = field(default_factory=dict)  # extra_state entries this seqtrain does not know
    # entries written although None: those a file stored as None, or a run's val_loss and best
    none_stored: frozenset[str] = frozenset()

    # ------------------------------------------------------------------------------------------------ reading
    @classmethod
    def from_dict(cls, checkpoint: dict | None) -> TrainState:
        """The training state of a loaded checkpoint dict (seqtrain's or fairseq's; None or a dict without
        these entries gives an empty record). Values are kept as stored: readers check what they use."""
        checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
        extra = checkpoint.get(EXTRA_STATE)
        extra = extra if isinstance(extra, dict) else {}
        known = {k: extra[k] for k in EXTRA_KEYS if k in extra}
        return cls(
            **{k: checkpoint.get(k) for k in TOP_LEVEL},
            **known,
            lora_base=checkpoint.get(BASE_KEY),
            other={k: v for k, v in extra.items() if k not in known},
            none_stored=frozenset(k for k, v in known.items() if v is None),
        )

    def says(self, key: str) -> bool:
        """Whether the checkpoint has the extra_state entry `key` (a stored None counts)."""
        return getattr(self, key) is not None or key in self.none_stored

    # ------------------------------------------------------------------------------------------------ writing
    @classmethod
    def at_save(
        cls, epoch: int, train_iterator: dict, val_loss: float | None, manager: dict, best: float | None
    ) -> TrainState:
        """A run's save: the data position and the validation record (the Trainer adds its own state)."""
        return cls(
            epoch=epoch,
            train_iterator=train_iterator,
            val_loss=val_loss,
            checkpoint_manager=manager,
            best=best,
            none_stored=_RUN_SAYS_NONE,
        )

    def extra_state(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in EXTRA_KEYS if self.says(k)}, **self.other}

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint entries of this state, in the order seqtrain writes them (after the model's)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in TOP_LEVEL}
        out[EXTRA_STATE] = self.extra_state()
        if self.lora_base is not None:
            out[BASE_KEY] = self.lora_base
        return out

    def replace(self, **changes: Any) -> TrainState:
        return dataclasses.replace(self, **changes)

    def without_optimizer(self) -> TrainState:
        """The state of a model to generate with or fine-tune from (an average): no optimizer, lr scheduler
        or loss scaler state; the rest as it was."""
        return self.replace(optimizer=None, lr_scheduler=None, loss_scaler=None)

    # ------------------------------------------------------------------------------------------------ fairseq
    def fairseq_extra_state(self, best: Any) -> dict[str, Any]:
        """extra_state of a fairseq 0.12 export: the data position fairseq-train resumes from (its
        checkpoint_utils.load_checkpoint reads train_iterator["epoch"]), the last validation, and `best` when
        it is a number (fairseq compares it with the next validation's)."""
        itr = self.train_iterator or {}
        epoch = max(int(itr.get("epoch", self.epoch if self.says("epoch") else 1) or 1), 1)
        out: dict[str, Any] = {
            "epoch": epoch,
            "train_iterator": {"epoch": epoch, "iterations_in_epoch": int(itr.get("iterations_in_epoch", 0))},
            "val_loss": self.val_loss,
        }
        if isinstance(best, (int, float)):
            out["best"] = float(best)
        return out
