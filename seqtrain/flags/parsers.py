"""The argparse parsers of the CLIs, assembled from each component's `add_args` (fairseq's flag names).

Precedence, highest first: flags on the command line > `--config FILE` values (seqtrain.flags.config_file) > the
`--arch` preset > each flag's default. Parsing takes two stages as in fairseq: first the component choices
(--task, --arch, --criterion, --optimizer, --lr-scheduler) are read, then the chosen components add their own
flags and the full command line is parsed. The arch preset runs last and only fills model fields still unset (None), so
explicit flags and config values win over it.

Why one module: every flag of every program is defined here once, so the CLIs, the config files,
`--print-config`-style tooling and docs/flags.md read one source; the file is long because the flags are many
(one call each), not because it holds logic.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from seqtrain.config import add_settings, left_out
from seqtrain.data import options as data_options
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.flags import fairseq_compat
from seqtrain.flags.config_file import actions_by_key, apply_config, config_text, load_config
from seqtrain.logging.progress import LOG_FORMATS
from seqtrain.optim.ema import EmaConfig
from seqtrain.registry import ARCHS
from seqtrain.scoring.settings import EvalRougeConfig, ScoreConfig

# The flags that pick a component; their values decide which further flags exist.
_CHOICE_FLAGS = (("--task",), ("--arch", "-a"), ("--criterion",), ("--optimizer",), ("--lr-scheduler",))


class UsageError(SeqtrainError):
    """A command-line syntax error found by argparse (the CLIs exit with 2 on it, as argparse does)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line; the usage is what --help is for) instead of printing the usage
    block and exiting, like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        text = fairseq_compat.unrecognized_message(self.get_default("_stage"), message)
        raise UsageError(f"{text}{did_you_mean(message, list(self._option_string_actions))} (see --help)")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        value = super()._get_value(action, arg_string)
        try:
            return check_value(action.dest, value)  # finite and in range (seqtrain.flag_bounds)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentError(action, str(e)) from None


def did_you_mean(message: str, options: list[str]) -> str:
    """For argparse's "unrecognized arguments: ...": the parser's nearest flag to each unknown one that is no
    fairseq flag (those are named by fairseq_compat.unrecognized_message), as "; did you mean --max-tokens?".
    allow_abbrev stays off (fairseq's prefixes would silently pick a flag); a suggestion only answers."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    longs = [o for o in options if o.startswith("--")]
    hints = []
    for arg in message[len(prefix) :].split():
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag in fairseq_compat.FAIRSEQ_FLAGS:
            continue
        close = difflib.get_close_matches(flag, longs, n=1, cutoff=0.75)
        if close:
            hints.append((flag, close[0]))
    if not hints:
        return ""
    if len(hints) == 1:
        return f"; did you mean {hints[0][1]}?"
    return "; did you mean " + ", ".join(f"{good} (for {bad})" for bad, good in hints) + "?"


# ------------------------------------------------------------------------------------------------- small types
def int_list(value: Any) -> list[int]:
    """fairseq's list-valued int flags (--update-freq): "2", "1,2,4", "[1, 2]" or an int/list."""
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    text = str(value).strip().strip("[]()")
    try:
        out = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or comma-separated integers, got {value!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected an integer or comma-separated integers, got {value!r}")
    return out


class _Switch(argparse._StoreTrueAction):
    """A store_true flag that also has a negative form (--no-X; for a flag named --no-X, --X): the negative
    turns off a true that a --config file set."""

    negatives: tuple[str, ...] = ()

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negatives)


def add_negations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every switch (store_true flag) of `parser` its negative form. Returns the parser."""
    for action in list(parser._actions):
        if type(action) is not argparse._StoreTrueAction:
            continue
        names = [o[2:] for o in action.option_strings if o.startswith("--")]
        negatives = tuple(
            neg
            for neg in (f"--{n[3:]}" if n.startswith("no-") else f"--no-{n}" for n in names)
            if neg not in parser._option_string_actions
        )
        if not negatives:
            continue
        action.__class__ = _Switch
        action.negatives = negatives  # type: ignore[attr-defined]
        action.option_strings = [*action.option_strings, *negatives]
        for neg in negatives:
            parser._option_string_actions[neg] = action
    return parser


def _add(group: Any, parser: argparse.ArgumentParser, *flags: str, **kw: Any) -> None:
    """Add a flag unless a component already declared it (components own their flags; these are fallbacks)."""
    if any(f in parser._option_string_actions for f in flags):
        return
    group.add_argument(*flags, **kw)


# ------------------------------------------------------------------------------------------------- flag groups
def add_common_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Common")
    _add(
        g,
        parser,
        "--config",
        metavar="FILE",
        help="YAML (or JSON) file of flag values (keys: flag names with - or _, at the top level or in "
        "sections); flags given on the command line override it",
    )
    _add(
        g,
        parser,
        "--print-config",
        action="store_true",
        help="print the resolved flags (command line > --config > arch preset > defaults) as a YAML config "
        "file that reproduces the run, and exit",
    )
    _add(g, parser, "--seed", type=int, default=1, metavar="N", help="random seed (default: 1)")
    _add(g, parser, "--cpu", action="store_true", help="use the CPU even when CUDA is available")
    _add(g, parser, "--fp16", action="store_true", help="fp16 autocast with dynamic loss scaling (CUDA)")
    _add(
        g,
        parser,
        "--bf16",
        action="store_true",
        help="bf16, no loss scaling (CUDA or CPU). Training: autocast over fp32 weights, or with --bf16-mode "
        "fairseq as fairseq's --bf16 (a bf16 model over fp32 master weights); generation: the model cast to bf16",
    )
    _add(
        g,
        parser,
        "--memory-efficient-fp16",
        action="store_true",
        help="accepted for fairseq command lines; implies --fp16 (seqtrain always keeps fp32 master weights "
        "and optimizer state, with fp16 autocast)",
    )
    _add(
        g,
        parser,
        "--memory-efficient-bf16",
        action="store_true",
        help="accepted for fairseq command lines; implies --bf16",
    )
    _add(
        g,
        parser,
        "--compile",
        action="store_true",
        help="torch.compile each encoder and decoder layer of the packed training path (CPU or CUDA; "
        "the criterion, the optimizer and generation stay eager)",
    )
    _add(
        g,
        parser,
        "--no-tf32",
        action="store_true",
        help="keep fp32 matrix products in full fp32 on CUDA (default: TF32 tensor cores, as on Ampere+)",
    )
    _add(
        g,
        parser,
        "--cudnn-attention",
        action="store_true",
        help="let attention use cuDNN's kernel on CUDA (default: off; it builds a plan, 0.1-0.4 s, for every "
        "new batch shape)",
    )
    _add(
        g,
        parser,
        "--deterministic",
        action="store_true",
        help="deterministic kernels (torch.use_deterministic_algorithms without warn_only, cuDNN "
        "deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset): two runs from the same state are "
        "bitwise equal on a GPU too, at a cost (docs/training.md); an operator without a deterministic "
        "kernel stops the run",
    )
    _add(g, parser, "--debug", action="store_true", help="show full tracebacks for user errors")
    _add(
        g,
        parser,
        "--check-data",
        action="store_true",
        help="check every token id of each opened data-bin split against its dictionary (default: the maximum "
        "id preprocess.json recorded, the whole .bin when under 64 MiB, else samples)",
    )


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Logging")
    _add(
        g,
        parser,
        "--log-format",
        default=None,
        choices=LOG_FORMATS,
        help="progress output (default: tqdm on a terminal, simple otherwise)",
    )
    _add(g, parser, "--log-interval", type=int, default=100, metavar="N", help="log progress every N updates")
    _add(g, parser, "--log-file", default=None, metavar="FILE", help="also write the log to this file")
    _add(g, parser, "--no-progress-bar", action="store_true", help="disable the tqdm progress bar")
    _add(
        g,
        parser,
        "--tensorboard-logdir",
        default=None,
        metavar="DIR",
        help="write TensorBoard scalars (train_inner/, train/, valid/ subfolders) to DIR",
    )
    _add(
        g,
        parser,
        "--peak-flops",
        type=float,
        default=None,
        metavar="FLOPS",
        help="peak FLOP/s of one device (default: from a table of A100/H100/H200 by precision); logs "
        "mfu = counted FLOP/s (source and target tokens, attention included; docs/performance.md) / peak",
    )
    _add(
        g,
        parser,
        "--profile",
        type=int,
        nargs="?",
        const=10,
        default=0,
        metavar="N",
        help="record a torch.profiler trace of N updates (bare --profile, as fairseq's: 10) after 1 warm-up, "
        "into --tensorboard-logdir or --save-dir",
    )


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    """Experiment trackers of seqtrain-train (seqtrain.logging.trackers), in the Logging group."""
    g = next(g for g in parser._action_groups if g.title == "Logging")
    _add(
        g,
        parser,
        "--wandb-project",
        default=None,
        metavar="NAME",
        help="also log to this Weights & Biases project (needs pip install 'seqtrain[wandb]'; WANDB_MODE=offline "
        "logs locally)",
    )
    _add(
        g,
        parser,
        "--wandb-run-name",
        default=None,
        metavar="NAME",
        help="the W&B run name (default: wandb's)",
    )
    _add(
        g,
        parser,
        "--jsonl-log",
        default=None,
        metavar="FILE",
        help='also append every logged line\'s stats to FILE as JSON lines ({"tag", "step", stat: value, ...})',
    )


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Distributed training")
    _add(
        g,
        parser,
        "--distributed-world-size",
        type=int,
        default=1,
        metavar="N",
        help="total number of processes (GPUs) across all nodes",
    )
    _add(g, parser, "--distributed-rank", type=int, default=0, metavar="N", help="rank of this process")
    _add(
        g,
        parser,
        "--distributed-backend",
        default=None,
        metavar="NAME",
        help="torch.distributed backend (default: nccl on CUDA, gloo on the CPU)",
    )
    _add(
        g,
        parser,
        "--distributed-timeout",
        type=float,
        default=1800,
        metavar="SECONDS",
        help="a collective waiting longer than this on another rank fails (instead of hanging)",
    )
    _add(
        g,
        parser,
        "--distributed-init-method",
        default=None,
        metavar="URL",
        help="init method, e.g. tcp://host:port (default: from torchrun's environment)",
    )
    _add(g, parser, "--distributed-port", type=int, default=-1, metavar="N", help="port for the init method")
    _add(
        g,
        parser,
        "--device-id",
        "--local_rank",
        type=int,
        default=0,
        metavar="N",
        help="which local GPU to use",
    )
    _add(
        g,
        parser,
        "--distributed-no-spawn",
        action="store_true",
        help="do not spawn one process per GPU (processes are launched externally, e.g. by torchrun)",
    )
    _add(
        g,
        parser,
        "--ddp-backend",
        default="pytorch_ddp",
        choices=("pytorch_ddp", "c10d", "legacy_ddp", "no_c10d", "fully_sharded"),
        help="data-parallel wrapper: DistributedDataParallel (pytorch_ddp, c10d, legacy_ddp, no_c10d are one) or "
        "fully_sharded (FSDP2: parameters, gradients and optimizer state sharded over ranks)",
    )
    _add(g, parser, "--bucket-cap-mb", type=int, default=25, metavar="MB", help="DDP bucket size")
    _add(g, parser, "--find-unused-parameters", action="store_true", help="DDP find_unused_parameters")


def add_optimization_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Optimization")
    _add(
        g, parser, "--max-epoch", type=int, default=0, metavar="N", help="stop after this epoch (0: no limit)"
    )
    _add(
        g,
        parser,
        "--max-update",
        type=int,
        default=0,
        metavar="N",
        help="stop after this many updates (0: no limit)",
    )
    _add(
        g,
        parser,
        "--stop-time-hours",
        type=float,
        default=0,
        metavar="H",
        help="stop after this much cumulative training time (0: no limit)",
    )
    _add(
        g,
        parser,
        "--clip-norm",
        type=float,
        default=0.0,
        metavar="NORM",
        help="clip gradients to this L2 norm (0: off)",
    )
    _add(
        g,
        parser,
        "--sentence-avg",
        action="store_true",
        help="normalize gradients by the number of sentences, not tokens",
    )
    _add(
        g,
        parser,
        "--update-freq",
        type=int_list,
        default=[1],
        metavar="N1,N2,...",
        help="accumulate gradients over N batches per update (a list gives one value per epoch)",
    )
    _add(
        g,
        parser,
        "--merge-max-tokens",
        type=int,
        default=0,
        metavar="N",
        help="run consecutive --update-freq batches of an update as one forward/backward pass while the merged "
        "batch, padded, holds at most N token slots (rows x longer side, as --max-tokens counts): the same "
        "update up to summation order and dropout masks; decided from the batches' shapes only, so resume "
        "stays exact. 0 (default): one pass per batch",
    )
    _add(
        g,
        parser,
        "--stop-min-lr",
        type=float,
        default=-1.0,
        metavar="LR",
        help="stop when the lr falls to this",
    )


def add_validation_args(parser: argparse.ArgumentParser, group: Any = None) -> None:
    g = group if group is not None else parser.add_argument_group("Validation")
    _add(g, parser, "--train-subset", default="train", metavar="SPLIT", help="split to train on")
    _add(
        g,
        parser,
        "--valid-subset",
        default="valid",
        metavar="SPLITS",
        help="comma-separated splits to validate on",
    )
    _add(g, parser, "--validate-interval", type=int, default=1, metavar="N", help="validate every N epochs")
    _add(
        g,
        parser,
        "--validate-interval-updates",
        type=int,
        default=0,
        metavar="N",
        help="also validate every N updates",
    )
    _add(
        g,
        parser,
        "--validate-after-updates",
        type=int,
        default=0,
        metavar="N",
        help="no validation before N updates",
    )
    _add(g, parser, "--disable-validation", action="store_true", help="never validate")
    _add(
        g,
        parser,
        "--max-valid-steps",
        type=int,
        default=None,
        metavar="N",
        help="validate on at most N batches",
    )


def add_freeze_args(parser: argparse.ArgumentParser) -> None:
    """Frozen weights for fine-tuning (seqtrain.models.freeze)."""
    g = parser.add_argument_group("Fine-tuning: frozen weights")
    _add(
        g,
        parser,
        "--freeze-encoder",
        action="store_true",
        help="train no encoder weight (with --share-all-embeddings this freezes the shared token embeddings too)",
    )
    _add(
        g,
        parser,
        "--freeze-embeddings",
        action="store_true",
        help="train no token or position embedding (nor the output projection tied to them)",
    )
    _add(
        g,
        parser,
        "--freeze-params",
        default=None,
        metavar="REGEX",
        help="train no parameter whose name matches REGEX (re.search; e.g. 'decoder\\.layers\\.[0-2]\\.')",
    )


def add_ema_args(parser: argparse.ArgumentParser) -> None:
    """fairseq's EMA flags (seqtrain.optim.ema), plus --validate-with-ema."""
    add_settings(parser, EmaConfig, "EMA of the weights")


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Checkpoint")
    _add(g, parser, "--save-dir", default="checkpoints", metavar="DIR", help="where to save checkpoints")
    _add(
        g,
        parser,
        "--restore-file",
        default="checkpoint_last.pt",
        metavar="FILE",
        help="checkpoint to resume from (default: checkpoint_last.pt, looked up in --save-dir); another path "
        "(e.g. pretrained weights) initialises only a first launch: once --save-dir has a checkpoint_last.pt, "
        "a relaunch resumes from that (see --restore-file-always); a Hugging Face hub name org/name[@revision] "
        "that is no local path is read from the hub cache's snapshot",
    )
    _add(
        g,
        parser,
        "--restore-file-always",
        action="store_true",
        help="load --restore-file at every launch, also when --save-dir has a checkpoint_last.pt (fairseq's "
        "behaviour; by default a relaunch resumes from checkpoint_last.pt and --restore-file with its --reset-* "
        "flags initialises only the first launch)",
    )
    _add(
        g,
        parser,
        "--finetune-from-model",
        default=None,
        metavar="FILE",
        help="start from this model's weights (optimizer, lr scheduler, meters and data position reset) when "
        "--save-dir has no checkpoint_last.pt yet; FILE may be a Hugging Face hub name org/name[@revision]",
    )
    _add(g, parser, "--reset-dataloader", action="store_true", help="do not restore the data position")
    _add(g, parser, "--reset-lr-scheduler", action="store_true", help="do not restore the lr scheduler")
    _add(g, parser, "--reset-meters", action="store_true", help="do not restore meters")
    _add(
        g,
        parser,
        "--reset-optimizer",
        action="store_true",
        help="do not restore the optimizer (nor the update count, lr scheduler and loss scale)",
    )
    _add(
        g,
        parser,
        "--optimizer-overrides",
        default="{}",
        metavar="DICT",
        help="JSON dict of optimizer hyper-parameters to override when restoring, e.g. '{\"lr\": 1e-4}'",
    )
    _add(
        g,
        parser,
        "--save-interval",
        type=int,
        default=1,
        metavar="N",
        help="save a checkpoint every N epochs",
    )
    _add(
        g,
        parser,
        "--save-interval-updates",
        type=int,
        default=0,
        metavar="N",
        help="also save checkpoint_{epoch}_{updates}.pt (and validate) every N updates",
    )
    _add(
        g,
        parser,
        "--keep-interval-updates",
        type=int,
        default=-1,
        metavar="N",
        help="keep only the last N update checkpoints",
    )
    _add(
        g,
        parser,
        "--keep-last-epochs",
        type=int,
        default=-1,
        metavar="N",
        help="keep only the last N epoch checkpoints",
    )
    _add(
        g,
        parser,
        "--keep-best-checkpoints",
        type=int,
        default=-1,
        metavar="N",
        help="keep the N best checkpoints as checkpoint.best_{metric}_{value}.pt",
    )
    _add(g, parser, "--no-save", action="store_true", help="save no checkpoints")
    _add(g, parser, "--no-epoch-checkpoints", action="store_true", help="save only best and last checkpoints")
    _add(g, parser, "--no-last-checkpoints", action="store_true", help="do not save checkpoint_last.pt")
    _add(
        g,
        parser,
        "--no-save-optimizer-state",
        action="store_true",
        help="leave optimizer state out of checkpoints (smaller; resuming then starts a fresh optimizer)",
    )
    _add(
        g,
        parser,
        "--save-adapters-only",
        action="store_true",
        help="LoRA runs (--lora-rank): checkpoints hold only the adapters (with their optimizer state, so a "
        "resume stays exact) and the base model's path and sha256; loading re-reads the base",
    )
    _add(
        g,
        parser,
        "--best-checkpoint-metric",
        default="loss",
        metavar="METRIC",
        help="validation metric that picks the best checkpoint",
    )
    _add(
        g,
        parser,
        "--maximize-best-checkpoint-metric",
        action="store_true",
        help="higher is better for --best-checkpoint-metric",
    )
    _add(
        g,
        parser,
        "--patience",
        type=int,
        default=-1,
        metavar="N",
        help="stop when validation has not improved for N consecutive validations (-1: off)",
    )
    _add(
        g,
        parser,
        "--unsafe-load",
        action="store_true",
        help="allow arbitrary unpickling when loading checkpoints (only for files you trust)",
    )
    _add(
        g,
        parser,
        "--resize-vocab",
        action="store_true",
        help=_RESIZE_VOCAB_HELP,
    )


_RESIZE_VOCAB_HELP = (
    "fit the checkpoint's embedding rows to a dictionary whose size differs by more than fairseq's padding "
    "explains (cut rows, or add mean-initialised ones); without it that is refused, as the dictionary probably "
    "belongs to another model"
)


# ------------------------------------------------------------------------------------------------- assembly
# Help shows groups in this order (by title prefix); components own their groups, options.py only orders them.
_GROUP_ORDER = (
    "positional",
    "options",
    "Common",
    "fp16",
    "Logging",
    "Dataset",
    "Task",
    "Model",
    "Criterion",
    "Optimization",
    "Optimizer",
    "LR scheduler",
    "Fine-tuning",
    "EMA",
    "Checkpoint",
    "Distributed",
)


def _order_groups(parser: argparse.ArgumentParser) -> None:
    def rank(group: Any) -> int:
        title = group.title or ""
        for i, prefix in enumerate(_GROUP_ORDER):
            if title.lower().startswith(prefix.lower()):
                return i
        return len(_GROUP_ORDER)

    parser._action_groups.sort(key=rank)  # stable: groups of equal rank keep their order


def _retitle(group: Any, title: str) -> None:
    if group is not None and hasattr(group, "title"):
        group.title = title


class HelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default, unless it is empty (None/False/[]) or the help text already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or default == []
            or not action.option_strings
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        return f"{text} (default: {shown})".replace("%", "%%") if "%" not in text else text


def get_parser(desc: str, default_task: str = "translation") -> argparse.ArgumentParser:
    from seqtrain.optim import loss_scaler  # imports torch: parsing stays free of it until a parser needs it

    parser = ArgumentParser(description=desc, allow_abbrev=False, formatter_class=HelpFormatter)
    add_common_args(parser)
    g = next(g for g in parser._action_groups if g.title == "Common")
    g.add_argument("--task", default=default_task, metavar="TASK", help="task (default: %(default)s)")
    _retitle(loss_scaler.add_args(parser), "fp16 loss scaling")
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
    common.add_argument(
        "--bf16-mode",
        choices=("autocast", "fairseq"),
        default="autocast",
        help="with --bf16: autocast (fp32 weights, each matrix product cast to bf16), or fairseq (as fairseq's "
        "--bf16: the model computes in bf16, the optimizer steps fp32 master weights, which checkpoints hold)",
    )
    model.add_argument(
        "--arch",
        "-a",
        default=None,
        metavar="ARCH",
        help=f"model architecture preset, required: {', '.join(ARCHS.names())}",
    )
    _retitle(criterions.add_args(parser), "Criterion")
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


def get_convert_parser() -> argparse.ArgumentParser:
    """seqtrain-convert's parser, composed from its settings (seqtrain.checkpoint.convert)."""
    from seqtrain.checkpoint import convert  # imports torch: only seqtrain-convert's parser needs it

    p = ArgumentParser(
        prog="seqtrain-convert",
        description="Convert a BART checkpoint between seqtrain, fairseq and Hugging Face formats.",
    )
    add_settings(p, convert.ConvertConfig, group=p)
    g = p.add_argument_group("generation_config.json (--to hf)", convert.HF_GENERATION_HELP)
    add_settings(p, convert.HfGenerationConfig, group=g)
    return add_negations(p)


def get_average_parser() -> argparse.ArgumentParser:
    """seqtrain-average-checkpoints' parser, composed from its settings (seqtrain.checkpoint.average)."""
    from seqtrain.checkpoint import average  # imports torch: only this program's parser needs it

    p = ArgumentParser(
        prog="seqtrain-average-checkpoints",
        description="Average the parameters of checkpoints (seqtrain or fairseq) into a new checkpoint.",
    )
    add_settings(p, average.AverageConfig, group=p)
    exclusive = p.add_mutually_exclusive_group()
    exclusive._group_actions += [p._option_string_actions[f] for f in average.EXCLUSIVE]
    return add_negations(p)


def get_score_parser() -> argparse.ArgumentParser:
    """seqtrain-score's parser, composed from its settings (seqtrain.scoring.settings)."""
    p = ArgumentParser(
        prog="seqtrain-score",
        description="ROUGE F1 x 100 (rouge-score, Porter stemming) averaged over lines; ROUGE-Lsum splits "
        "sentences at '.', '!', '?' followed by whitespace.",
    )
    add_settings(p, ScoreConfig, group=p)
    return add_negations(p)


def _add_choice_args(parser: argparse.ArgumentParser, dest: str, name: str) -> None:
    """Add the flags of the chosen task / optimizer / lr scheduler."""
    # these import torch and register the tasks, optimizers and schedulers; parsing needs them from here on
    import seqtrain.tasks  # noqa: F401
    from seqtrain import registry
    from seqtrain.optim import lr_scheduler, optimizers

    table = {
        "task": registry.TASKS,
        "optimizer": registry.OPTIMIZERS,
        "lr_scheduler": registry.LR_SCHEDULERS,
    }[dest]
    if name not in table:
        raise SeqtrainError(
            f"--{dest.replace('_', '-')}: unknown {table.kind} {name!r}; "
            f"choose from: {', '.join(table.names())}"
        )
    if dest == "task":
        cls = table.get(name)
        # a CLI that declared DATA itself (seqtrain-generate: optional with --input) keeps its own
        if hasattr(cls, "add_args") and not any(a.dest == "data" for a in parser._actions):
            cls.add_args(parser)
        if hasattr(cls, "add_task_flags"):  # the task's own flags, beside DATA: every CLI takes them
            cls.add_task_flags(parser)
    elif dest == "optimizer":
        _retitle(optimizers.add_args(parser, name), f"Optimizer ({name})")
    else:
        _retitle(lr_scheduler.add_args(parser, name), f"LR scheduler ({name})")


# ------------------------------------------------------------------------------------------------- parsing
def _pre_parse(argv: Sequence[str], defaults: dict[str, Any]) -> argparse.Namespace:
    """Read --config and the component choices without failing on flags that do not exist yet."""
    pre = ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=None)
    for flags in _CHOICE_FLAGS:
        dest = flags[0].lstrip("-").replace("-", "_")
        pre.add_argument(*flags, dest=dest, default=defaults.get(dest))
    args, _ = pre.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    return args


def _config_value(config: dict[str, Any], dest: str) -> Any:
    for key in (dest, dest.replace("_", "-"), "--" + dest.replace("_", "-")):
        if key in config:
            return config[key]
    return None


def training_flags(choices: argparse.Namespace) -> dict[str, argparse.Action]:
    """seqtrain-train's flags for the components `choices` names (--task, --optimizer, --lr-scheduler), keyed
    as config keys: the keys a generation program skips in a preset (one config serves both)."""
    try:
        other = get_training_parser()
        for dest in ("task", "optimizer", "lr_scheduler"):
            _add_choice_args(other, dest, getattr(choices, dest))
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


def _refuse_left_out(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """The flags of a group the program composes that it leaves out (seqtrain.config.left_out): one line each."""
    out = left_out(parser)
    for arg in argv:
        if arg == "--":
            break
        if arg.split("=", 1)[0] in out:
            raise UsageError(f"{arg.split('=', 1)[0]}: does nothing in {parser.prog}; remove it")


def parse_args_and_arch(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    other_flags: Callable[[argparse.Namespace], dict[str, argparse.Action]] | None = None,
) -> argparse.Namespace:
    """Parse `argv` with `parser` once the chosen components added their flags; then apply the arch preset.
    `other_flags(choices)`: the flags of the other programs a --config file may hold, keyed as config keys
    (a preset serves training and generation; each program skips the other's keys, checking their values).
    The programs above this layer compose their parsers and pass their flags (seqtrain.generation.options)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_left_out(parser, argv)
    stage = parser.get_default("_stage")
    # Choices default to the parser's defaults (fairseq's: adam is seqtrain's default optimizer, fixed the
    # scheduler), then the config file, then the command line.
    defaults = {
        "task": parser.get_default("task") or "translation",
        "optimizer": "adam",
        "lr_scheduler": "fixed",
    }
    first = _pre_parse(argv, defaults)
    config: dict[str, Any] = {}
    lines: dict[str, int] = {}
    if first.config:
        config, lines = load_config(first.config)
        for dest in ("task", "arch", "criterion", "optimizer", "lr_scheduler"):
            if _config_value(config, dest) is not None:
                defaults[dest] = _config_value(config, dest)
        first = _pre_parse(argv, defaults)

    _add_choice_args(parser, "task", first.task)
    if stage == "train":
        _add_choice_args(parser, "optimizer", first.optimizer)
        _add_choice_args(parser, "lr_scheduler", first.lr_scheduler)
        if first.arch is not None:
            if first.arch not in ARCHS:
                raise SeqtrainError(
                    f"--arch: unknown arch {first.arch!r}; choose from: {', '.join(ARCHS.names())}"
                )
    _order_groups(parser)
    add_negations(parser)
    if first.config:
        ignore = other_flags(first) if other_flags is not None else {}
        apply_config(parser, first.config, config, lines, ignore=ignore)

    args = parser.parse_args(argv)
    if stage == "train":
        if not args.arch:
            raise SeqtrainError(f"--arch is required; choose from: {', '.join(ARCHS.names())}")
        ARCHS.get(args.arch)(args)  # fills only fields still None: explicit flags and config values win
    # fairseq: the memory-efficient variants imply the plain ones (seqtrain keeps fp32 master weights for both)
    if getattr(args, "memory_efficient_fp16", False):
        args.fp16 = True
    if getattr(args, "memory_efficient_bf16", False):
        args.bf16 = True
    fairseq_compat.apply(args)
    if hasattr(args, "_stage"):
        del args._stage
    if getattr(args, "config", None):
        args.config = os.path.abspath(args.config)
    if getattr(args, "print_config", False):
        args.print_config = False  # the printed file must not print itself
        sys.stdout.write(config_text(parser, args, CONFIG_HEADER))
        raise SystemExit(0)  # as --help: print, then exit
    return args


CONFIG_HEADER = (
    "The resolved flags of a seqtrain run (command line > --config > arch preset > defaults):\n"
    "--config THIS_FILE alone reproduces them."
)


def resolved_train_config(args: argparse.Namespace) -> str:
    """The flags of a parsed seqtrain-train run as a YAML config file (see config_file.config_text)."""
    parser = get_training_parser()
    _add_choice_args(parser, "task", args.task)
    _add_choice_args(parser, "optimizer", args.optimizer)
    _add_choice_args(parser, "lr_scheduler", args.lr_scheduler)
    _order_groups(parser)
    return config_text(parser, args, CONFIG_HEADER)
