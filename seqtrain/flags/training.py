"""seqtrain-train's parser, composed from the settings groups training uses (fairseq's flag names and defaults),
parsed in two stages by seqtrain.flags.parsing, and the resolved flags of a run as a config file.

It sits in the flag layer, not in seqtrain/train/, because generation reads it too (a --config preset serves
both programs, each skipping the other's keys) and training imports generation (ROUGE validation)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seqtrain.config import add_settings
from seqtrain.cuda import Bf16ModeConfig
from seqtrain.data import options as data_options
from seqtrain.errors import SeqtrainError
from seqtrain.flags import fairseq_compat
from seqtrain.flags.config_file import actions_by_key, config_text
from seqtrain.flags.parsers import (
    ArgumentParser,
    HelpFormatter,
    _order_groups,
    _retitle,
    add_common_args,
    add_distributed_args,
    add_logging_args,
)
from seqtrain.flags.parsing import CONFIG_HEADER, PER_CHOICE, add_choice_args, parse_args_and_arch
from seqtrain.logging.trackers import TrackingConfig
from seqtrain.optim import OptimizationConfig
from seqtrain.optim.ema import EmaConfig
from seqtrain.registry import ARCHS
from seqtrain.scoring.settings import EvalRougeConfig


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    """Experiment trackers of seqtrain-train (seqtrain.logging.trackers), in the Logging group."""
    add_settings(parser, TrackingConfig, group=next(g for g in parser._action_groups if g.title == "Logging"))


def add_optimization_args(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, OptimizationConfig, "Optimization")


def add_validation_args(parser: argparse.ArgumentParser, group: Any = None) -> None:
    add_settings(parser, data_options.ValidationConfig, "Validation", group=group)


def add_freeze_args(parser: argparse.ArgumentParser) -> None:
    """Frozen weights for fine-tuning (seqtrain.models.freeze)."""
    from seqtrain.models.freeze import (
        FreezeConfig,  # imports torch and the models: seqtrain-train's parser only
    )

    add_settings(parser, FreezeConfig, "Fine-tuning: frozen weights")


def add_ema_args(parser: argparse.ArgumentParser) -> None:
    """fairseq's EMA flags (seqtrain.optim.ema), plus --validate-with-ema."""
    add_settings(parser, EmaConfig, "EMA of the weights")


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    # the checkpoint package imports the formats and the models: only seqtrain-train's parser pays for them
    from seqtrain.checkpoint.options import CheckpointConfig

    add_settings(parser, CheckpointConfig, "Checkpoint")


def add_loss_scaling_args(parser: argparse.ArgumentParser) -> Any:
    """fairseq's fp16 loss-scaling flags (seqtrain.optim.loss_scaler): seqtrain-train's, which the generation
    programs leave out (fairseq-generate accepts them). Returns the group."""
    from seqtrain.optim import loss_scaler  # imports torch: parsing stays free of it until a parser needs it

    group = loss_scaler.add_args(parser)
    _retitle(group, "fp16 loss scaling")
    return group


def get_parser(desc: str, default_task: str = "translation") -> argparse.ArgumentParser:
    parser = ArgumentParser(description=desc, allow_abbrev=False, formatter_class=HelpFormatter)
    add_common_args(parser)
    g = next(g for g in parser._action_groups if g.title == "Common")
    g.add_argument("--task", default=default_task, metavar="TASK", help="task (default: %(default)s)")
    add_loss_scaling_args(parser)
    add_logging_args(parser)
    return parser


def get_training_parser(default_task: str = "translation") -> argparse.ArgumentParser:
    """The seqtrain-train parser before the chosen task/optimizer/scheduler flags (parse_args_and_arch adds
    those once the choices are known)."""
    # these import torch and register the archs and criteria: only seqtrain-train's parser pays for them
    import seqtrain.criterions as criterions
    import seqtrain.models as models

    parser = get_parser("Train a sequence-to-sequence model (fairseq-compatible flags).", default_task)
    dataset = data_options.add_dataset_args(parser, train=True)
    _retitle(dataset, "Dataset and batching")
    add_validation_args(parser, dataset)
    model = models.add_args(parser)
    _retitle(model, "Model configuration")
    common = next(g for g in parser._action_groups if g.title == "Common")
    add_settings(parser, Bf16ModeConfig, group=common)
    model.add_argument(
        "--arch",
        "-a",
        default=None,
        metavar="ARCH",
        help=f"model architecture preset, required: {', '.join(ARCHS.names())}",
    )
    _retitle(criterions.add_args(parser), "Criterion")  # every criterion's flags: --help lists them all
    add_optimization_args(parser)
    add_settings(parser, EvalRougeConfig, group=dataset)
    add_freeze_args(parser)
    add_ema_args(parser)
    add_checkpoint_args(parser)
    add_distributed_args(parser)
    add_tracking_args(parser)
    fairseq_compat.add_args(parser)
    parser.set_defaults(_stage="train")
    _order_groups(parser)
    return parser


def training_flags(choices: argparse.Namespace) -> dict[str, argparse.Action]:
    """seqtrain-train's flags for the components `choices` names (--task, --optimizer, --lr-scheduler), keyed
    as config keys: the keys a generation program skips in a preset (one config serves both)."""
    try:
        other = get_training_parser()
        for dest in PER_CHOICE["train"]:
            add_choice_args(other, dest, getattr(choices, dest))
    except SeqtrainError:  # an unknown component is reported by the parser that owns it
        return {}
    return actions_by_key(other)


def parse_train_args(
    argv: Sequence[str] | None = None,
    other_flags: Callable[[argparse.Namespace], dict[str, argparse.Action]] | None = None,
) -> argparse.Namespace:
    """seqtrain-train's flags, parsed (`argv` defaults to sys.argv[1:]); --user-dir is imported first.
    `other_flags`: the other programs' flags, whose keys a --config file may hold (see parse_args_and_arch)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    fairseq_compat.import_user_dir_of(argv)
    return parse_args_and_arch(get_training_parser(), argv, other_flags)


def resolved_train_config(flags: Mapping[str, Any]) -> str:
    """A seqtrain-train run's flags (plain values by dest: its record, seqtrain.train.program.run_record) as a
    YAML config file (see config_file.config_text)."""
    args = argparse.Namespace(**flags)
    parser = get_training_parser()
    for dest in PER_CHOICE["train"]:
        add_choice_args(parser, dest, getattr(args, dest))
    _order_groups(parser)
    return config_text(parser, args, CONFIG_HEADER)
