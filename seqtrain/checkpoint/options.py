"""The Checkpoint flags of a training run, declared once: CheckpointConfig is both seqtrain-train's Checkpoint
argument group and the typed settings seqtrain.train.checkpoints.CheckpointManager applies (the manager lives
with the training program, above the flag layer; its settings live here so that the parsers can read them)."""

from __future__ import annotations

from seqtrain.config import setting, settings
from seqtrain.flag_bounds import OFF_OR_COUNT, POSITIVE_INT

UNSAFE_LOAD_HELP = "allow arbitrary unpickling when loading checkpoints (only for files you trust)"
RESIZE_VOCAB_HELP = (
    "fit the checkpoint's embedding rows to a dictionary whose size differs by more than fairseq's padding "
    "explains (cut rows, or add mean-initialised ones); without it that is refused, as the dictionary probably "
    "belongs to another model"
)


@settings
class CheckpointConfig:
    """Checkpoint: where and when a training run saves, what it keeps, where it resumes from, and --patience"""

    save_dir: str = setting("checkpoints", "where to save checkpoints", metavar="DIR")
    restore_file: str = setting(
        "checkpoint_last.pt",
        "checkpoint to resume from (default: checkpoint_last.pt, looked up in --save-dir); another path "
        "(e.g. pretrained weights) initialises only a first launch: once --save-dir has a checkpoint_last.pt, "
        "a relaunch resumes from that (see --restore-file-always); a Hugging Face hub name org/name[@revision] "
        "that is no local path is read from the hub cache's snapshot",
        metavar="FILE",
    )
    restore_file_always: bool = setting(
        False,
        "load --restore-file at every launch, also when --save-dir has a checkpoint_last.pt (fairseq's "
        "behaviour; by default a relaunch resumes from checkpoint_last.pt and --restore-file with its --reset-* "
        "flags initialises only the first launch)",
        action="store_true",
    )
    finetune_from_model: str | None = setting(
        None,
        "start from this model's weights (optimizer, lr scheduler, meters and data position reset) when "
        "--save-dir has no checkpoint_last.pt yet; FILE may be a Hugging Face hub name org/name[@revision]",
        metavar="FILE",
    )
    reset_dataloader: bool = setting(False, "do not restore the data position", action="store_true")
    reset_lr_scheduler: bool = setting(False, "do not restore the lr scheduler", action="store_true")
    reset_meters: bool = setting(False, "do not restore meters", action="store_true")
    reset_optimizer: bool = setting(
        False,
        "do not restore the optimizer (nor the update count, lr scheduler and loss scale)",
        action="store_true",
    )
    optimizer_overrides: str = setting(
        "{}",
        "JSON dict of optimizer hyper-parameters to override when restoring, e.g. '{\"lr\": 1e-4}'",
        metavar="DICT",
    )
    save_interval: int = setting(
        1, "save a checkpoint every N epochs", type=int, metavar="N", bounds=POSITIVE_INT
    )
    save_interval_updates: int = setting(
        0, "also save checkpoint_{epoch}_{updates}.pt (and validate) every N updates", type=int, metavar="N"
    )
    keep_interval_updates: int = setting(
        -1, "keep only the last N update checkpoints", type=int, metavar="N", bounds=OFF_OR_COUNT
    )
    keep_last_epochs: int = setting(
        -1, "keep only the last N epoch checkpoints", type=int, metavar="N", bounds=OFF_OR_COUNT
    )
    keep_best_checkpoints: int = setting(
        -1,
        "keep the N best checkpoints as checkpoint.best_{metric}_{value}.pt",
        type=int,
        metavar="N",
        bounds=OFF_OR_COUNT,
    )
    no_save: bool = setting(False, "save no checkpoints", action="store_true")
    no_epoch_checkpoints: bool = setting(False, "save only best and last checkpoints", action="store_true")
    no_last_checkpoints: bool = setting(False, "do not save checkpoint_last.pt", action="store_true")
    no_save_optimizer_state: bool = setting(
        False,
        "leave optimizer state out of checkpoints (smaller; resuming then starts a fresh optimizer)",
        action="store_true",
    )
    save_adapters_only: bool = setting(
        False,
        "LoRA runs (--lora-rank): checkpoints hold only the adapters (with their optimizer state, so a "
        "resume stays exact) and the base model's path and sha256; loading re-reads the base",
        action="store_true",
    )
    best_checkpoint_metric: str = setting(
        "loss", "validation metric that picks the best checkpoint", metavar="METRIC"
    )
    maximize_best_checkpoint_metric: bool = setting(
        False, "higher is better for --best-checkpoint-metric", action="store_true"
    )
    patience: int = setting(
        -1,
        "stop when validation has not improved for N consecutive validations (-1: off)",
        type=int,
        metavar="N",
        bounds=OFF_OR_COUNT,
    )
    unsafe_load: bool = setting(False, UNSAFE_LOAD_HELP, action="store_true")
    resize_vocab: bool = setting(False, RESIZE_VOCAB_HELP, action="store_true")
    # the run's place among the ranks (the Distributed flags, seqtrain.distributed.LaunchConfig's): only rank 0
    # writes, and a resume checks the world size it was saved with
    distributed_rank: int = 0
    distributed_world_size: int = 1
