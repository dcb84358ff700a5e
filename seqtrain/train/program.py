"""seqtrain-train's front end: the parsed flags read once into a TrainConfig (train_config), and the `args` record
a run's checkpoints store, written once from those flags and what set-up settled (run_record).

A TrainConfig nests each group as its component declares it (torchtitan's Trainer.Config nests a Config per
component the same way) and the chosen components' settings as their registries name them
(`REGISTRY.config(name)`: the task's, model's, criterion's, optimizer's and schedule's). Below this module nothing
holds the parsed flags: the loop (seqtrain.train.loop), the Trainer, the checkpoint policy and the components take
their typed pieces. As nanoGPT keeps a checkpoint's `model_args` apart from the run's config, the record a
checkpoint stores is not a config anything reads a setting from: it is fairseq's `args` record, kept byte for
byte as seqtrain always wrote it (fairseq loads the exports; tests/e2e/test_train_record.py compares it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any

from seqtrain import distributed
from seqtrain.checkpoint.options import CheckpointConfig
from seqtrain.config import from_args
from seqtrain.criterions import CriterionConfig, check_criterion_flags
from seqtrain.cuda import Bf16ModeConfig, DeviceConfig
from seqtrain.data.options import TrainDatasetConfig, ValidationConfig
from seqtrain.flags.parsing import CHOICES, check_choice
from seqtrain.logging.progress import LoggingConfig
from seqtrain.logging.trackers import TrackingConfig
from seqtrain.models import BartConfig
from seqtrain.models.freeze import FreezeConfig
from seqtrain.optim import OptimizationConfig
from seqtrain.optim.ema import EmaConfig
from seqtrain.optim.loss_scaler import LossScalerConfig
from seqtrain.optim.lr_scheduler import SchedulerConfig
from seqtrain.optim.optimizers import LrConfig
from seqtrain.scoring.settings import EvalRougeConfig
from seqtrain.tasks.translation import TranslationConfig
from seqtrain.train.trainer import TrainerConfig


@dataclass
class LoopConfig:
    """What the epoch loop reads besides batching and checkpointing: when it stops (the update and epoch
    limits, --stop-time-hours, --stop-min-lr), how an update's batches run (--update-freq, --merge-max-tokens),
    when and on how much it validates, and how it logs (interval, format, progress bar, --profile)."""

    update: OptimizationConfig = field(default_factory=OptimizationConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


@dataclass
class TrainConfig:
    """What seqtrain-train reads of its flags: made once from the parsed flags (train_config), each group as its
    component declares it. `flags` is the parsed flags as plain values, kept for the records a run writes (its
    checkpoints' `args`, config.yaml and the trackers' run config: run_record); nothing reads a setting there."""

    # the chosen components' settings, each its registry's class (REGISTRY.config(name))
    task: Any = field(default_factory=TranslationConfig)  # the data-bin, languages, positions, ...
    model: BartConfig = field(default_factory=BartConfig)  # the --arch preset filled in (when parsed)
    criterion: Any = field(default_factory=CriterionConfig)
    optimizer: Any = field(default_factory=LrConfig)
    lr_scheduler: Any = field(default_factory=SchedulerConfig)
    # the groups
    data: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)  # batching, splits; the task's too
    loop: LoopConfig = field(default_factory=LoopConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    precision: Bf16ModeConfig = field(default_factory=Bf16ModeConfig)
    loss_scaler: LossScalerConfig = field(default_factory=LossScalerConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    launch: distributed.LaunchConfig = field(default_factory=distributed.LaunchConfig)
    parallel: distributed.DataParallelConfig = field(default_factory=distributed.DataParallelConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    rouge: EvalRougeConfig = field(default_factory=EvalRougeConfig)
    arch: str | None = None  # --arch
    data_path: str | None = None  # DATA, as given (the task's settings hold it too)
    config: str | None = None  # --config (the preset the run read, named in its closing lines)
    user_dir: str | None = None  # --user-dir (a spawned rank imports it again)
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def trainer(self) -> TrainerConfig:
        """The Trainer's settings: the groups it reads (the same objects as here) and the chosen optimizer's and
        schedule's."""
        return TrainerConfig(
            device=self.device,
            precision=self.precision,
            launch=self.launch,
            parallel=self.parallel,
            update=self.loop.update,
            loss_scaler=self.loss_scaler,
            freeze=self.freeze,
            ema=self.ema,
            checkpoint=self.checkpoint,
            logging=self.loop.logging,
            optimizer=self.optimizer.optimizer,
            optim=self.optimizer,
            schedule=self.lr_scheduler,
            lora_rank=self.model.lora_rank,
            encoder_layers_to_keep=self.model.encoder_layers_to_keep,
            decoder_layers_to_keep=self.model.decoder_layers_to_keep,
            max_tokens=self.data.max_tokens,
        )


# the component each choice flag names when it is unset (a library caller's Namespace); the model's flag is --arch
DEFAULT_CHOICES = {
    "task": "translation",
    "criterion": "cross_entropy",
    "optimizer": "adam",
    "lr_scheduler": "fixed",
}


def _chosen(args: argparse.Namespace, dest: str) -> type:
    """The settings class of the component --dest names (its registry's; the kind's common one when unset)."""
    name = getattr(args, dest, None) or DEFAULT_CHOICES.get(dest)
    if not name:
        return CHOICES[dest].common
    check_choice(dest, name)  # (a parsed command line named a registered one already)
    return CHOICES[dest].config(name)


def train_config(args: argparse.Namespace) -> TrainConfig:
    """seqtrain-train's settings from its parsed flags (seqtrain.flags.training.parse_train_args), read once: the
    one conversion of training's flags. The chosen components' settings are their registries' classes (a
    --user-dir component registered without one gets its kind's common settings); a criterion flag the chosen
    criterion does not read, given, is refused with one line."""
    chosen = {dest: from_args(_chosen(args, dest), args) for dest in DEFAULT_CHOICES}
    check_criterion_flags(chosen["criterion"].criterion, lambda dest: getattr(args, dest, None))
    model = from_args(_chosen(args, "arch"), args)
    cfg = from_args(
        TrainConfig,
        args,
        **chosen,
        model=model,
        data_path=getattr(args, "data", None),
        flags=dict(vars(args)),
    )
    if isinstance(getattr(cfg.task, "dataset", None), TrainDatasetConfig):
        cfg.task.dataset = cfg.data  # one object: what the task settles (the languages), the loop sees
    return cfg


def run_record(cfg: TrainConfig, model: BartConfig | None = None) -> dict[str, Any]:
    """The `args` record of a run (seqtrain checkpoints' `args`, as fairseq's): its parsed flags with what set-up
    settled read from the typed settings (the launcher's world size, rank and device, the validation batch
    sizes, the languages the task found, the --max-tokens auto budget) and, given `model` (the built model's
    settings, seqtrain.models.as_built), the model's fields: the record names the model that was built.
    config.yaml is the record made before the task and model exist (seqtrain.flags.training.resolved_train_config),
    so reading it back reproduces the flags."""
    record = dict(cfg.flags)
    launch, data = cfg.launch, cfg.data
    record.update(
        distributed_world_size=launch.distributed_world_size,
        distributed_rank=launch.distributed_rank,
        device_id=launch.device_id,
        max_tokens=data.max_tokens,
        max_tokens_valid=data.max_tokens_valid,
        batch_size_valid=data.batch_size_valid,
        source_lang=data.source_lang,
        target_lang=data.target_lang,
    )
    if model is not None:
        record.update({f.name: getattr(model, f.name) for f in fields(model) if f.name in record})
    return record
