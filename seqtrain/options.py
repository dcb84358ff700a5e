"""The argparse parsers of the CLIs, assembled from each component's `add_args` (fairseq's flag names).

Precedence, highest first: flags on the command line > `--config FILE` values (seqtrain.config_file) > the
`--arch` preset > each flag's default. Parsing takes two stages as in fairseq: first the component choices
(--task, --arch, --criterion, --optimizer, --lr-scheduler) are read, then the chosen components add their own
flags and the full command line is parsed. The arch preset runs last and only fills model fields still unset (None), so
explicit flags and config values win over it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from seqtrain.config_file import actions_by_key, apply_config, load_config
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.logging.progress import LOG_FORMATS

# The flags that pick a component; their values decide which further flags exist.
_CHOICE_FLAGS = (("--task",), ("--arch", "-a"), ("--criterion",), ("--optimizer",), ("--lr-scheduler",))


class UsageError(SeqtrainError):
    """A command-line syntax error found by argparse (the CLIs exit with 2 on it, as argparse does)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line; the usage is what --help is for) instead of printing the usage
    block and exiting, like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        value = super()._get_value(action, arg_string)
        try:
            return check_value(action.dest, value)  # finite and in range (seqtrain.flag_bounds)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentError(action, str(e)) from None


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
        help="JSON or YAML-style `key: value` file of flag defaults (keys: flag names with - or _); "
        "flags given on the command line override it",
    )
    _add(g, parser, "--seed", type=int, default=1, metavar="N", help="random seed (default: 1)")
    _add(g, parser, "--cpu", action="store_true", help="use the CPU even when CUDA is available")
    _add(g, parser, "--fp16", action="store_true", help="fp16 autocast with dynamic loss scaling (CUDA)")
    _add(g, parser, "--bf16", action="store_true", help="bf16 autocast (CUDA; no loss scaling needed)")
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
    _add(g, parser, "--compile", action="store_true", help="torch.compile the model (CUDA recommended)")
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
        help="peak FLOP/s of one device (e.g. 989e12 for H100 bf16); logs mfu = achieved / peak, "
        "achieved ~ 6 x params x target tokens/s",
    )
    _add(
        g,
        parser,
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="record a torch.profiler trace of N updates (after 1 warm-up) into --tensorboard-logdir or --save-dir",
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


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Checkpoint")
    _add(g, parser, "--save-dir", default="checkpoints", metavar="DIR", help="where to save checkpoints")
    _add(
        g,
        parser,
        "--restore-file",
        default="checkpoint_last.pt",
        metavar="FILE",
        help="checkpoint to resume from (default: checkpoint_last.pt, looked up in --save-dir; "
        "any other path is used as given)",
    )
    _add(
        g,
        parser,
        "--finetune-from-model",
        default=None,
        metavar="FILE",
        help="start from this model's weights (optimizer, lr scheduler, meters and data position reset) when "
        "--save-dir has no checkpoint_last.pt yet",
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
    from seqtrain.optim import loss_scaler

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
    import seqtrain.criterions as criterions
    import seqtrain.models as models
    from seqtrain.data import options as data_options
    from seqtrain.registry import ARCHS

    parser = get_parser("Train a sequence-to-sequence model (fairseq-compatible flags).", default_task)
    dataset = data_options.add_dataset_args(parser, train=True)
    _retitle(dataset, "Dataset and batching")
    add_validation_args(parser, dataset)
    model = models.add_args(parser)
    _retitle(model, "Model configuration")
    model.add_argument(
        "--arch",
        "-a",
        default=None,
        metavar="ARCH",
        help=f"model architecture preset, required: {', '.join(ARCHS.names())}",
    )
    _retitle(criterions.add_args(parser), "Criterion")
    add_optimization_args(parser)
    from seqtrain import eval_rouge

    eval_rouge.add_args(parser, dataset)
    add_checkpoint_args(parser)
    add_distributed_args(parser)
    parser.set_defaults(_stage="train")
    _order_groups(parser)
    return parser


def _generation_base_parser(default_task: str = "translation") -> argparse.ArgumentParser:
    """The flags seqtrain-generate shares with seqtrain-train (common, dataset, checkpoint, distributed)."""
    from seqtrain.data import options as data_options

    parser = get_parser("Generate with a trained model (fairseq-compatible flags).", default_task)
    _retitle(data_options.add_dataset_args(parser, train=False, gen=True), "Dataset and batching")
    g = parser.add_argument_group("Checkpoint")
    g.add_argument("--path", metavar="FILE", help="checkpoint(s) to generate with, colon-separated")
    g.add_argument("--results-path", default=None, metavar="DIR", help="write generate-{split}.txt here")
    _add(
        g,
        parser,
        "--unsafe-load",
        action="store_true",
        help="allow arbitrary unpickling when loading checkpoints (only for files you trust)",
    )
    add_distributed_args(parser)
    parser.set_defaults(_stage="generate")
    _order_groups(parser)
    return parser


def get_generation_parser(default_task: str = "translation") -> argparse.ArgumentParser:
    """The seqtrain-generate parser before the chosen task's flags (parse_args_and_arch adds those)."""
    from seqtrain.generation.options import add_generation_args

    parser = _generation_base_parser(default_task)
    parser.prog = "seqtrain-generate"
    parser.add_argument(
        "data",
        nargs="?",
        default=None,
        metavar="DATA",
        help="data-bin folder (optional with --input when the checkpoint carries its tokenizer)",
    )
    g = add_generation_args(parser)
    g.add_argument(
        "--input",
        default=None,
        metavar="FILE",
        help="summarize raw text, one document per line ('-' for stdin), instead of a data-bin split",
    )
    g.add_argument(
        "--reference",
        default=None,
        metavar="FILE",
        help="reference summaries for --input (one per line), for --scoring rouge",
    )
    g.add_argument(
        "--scoring",
        default="none",
        choices=["none", "rouge"],
        help="score hypotheses against the references (ROUGE-1/2/L/Lsum F1, stemming on)",
    )
    g.add_argument(
        "--post-process",
        "--remove-bpe",
        default=None,
        nargs="?",
        const="@@ ",
        dest="post_process",
        metavar="SYMBOL",
        help="undo subword splitting in S-/T-/H- lines (sentencepiece, subword_nmt, "
        "'@@ '); D- lines and the hypothesis file are always detokenized",
    )
    g.add_argument("--quiet", action="store_true", help="print only the summary lines, not S-/T-/H-/D-/P-")
    g.add_argument(
        "--model-overrides",
        default="{}",
        metavar="JSON",
        help="model args to override, e.g. '{\"dropout\": 0.0}'",
    )
    _order_groups(parser)
    return parser


def get_preprocessing_parser() -> argparse.ArgumentParser:
    from seqtrain.preprocess import add_args

    parser = ArgumentParser(
        prog="seqtrain-preprocess",
        description="Tokenize, build dictionaries and binarize parallel text into a fairseq-style data-bin.",
    )
    return add_args(parser)


def get_convert_parser() -> argparse.ArgumentParser:
    from seqtrain.formats import FORMATS

    p = ArgumentParser(
        prog="seqtrain-convert",
        description="Convert a BART checkpoint between seqtrain, fairseq and Hugging Face formats.",
    )
    p.add_argument("input", help="checkpoint file (seqtrain / fairseq) or Hugging Face model folder")
    p.add_argument("output", help="output file (--to seqtrain / fairseq) or folder (--to hf)")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument(
        "--from",
        dest="from_format",
        default="auto",
        choices=("auto",) + FORMATS,
        help="input format (default: detect)",
    )
    p.add_argument(
        "--dict",
        dest="dict_path",
        metavar="PATH",
        help="dict.txt (or a data-bin folder) for fairseq inputs; default: dict.txt next to the input",
    )
    p.add_argument(
        "--unsafe-load",
        action="store_true",
        help="allow arbitrary unpickling of the input (may run code; only for trusted files)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def get_score_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="seqtrain-score",
        description="ROUGE F1 x 100 (rouge-score, Porter stemming) averaged over lines; ROUGE-Lsum splits "
        "sentences at '.', '!', '?' followed by whitespace.",
    )
    p.add_argument("--sys", required=True, metavar="HYP", help="hypotheses, one per line")
    p.add_argument("--ref", required=True, metavar="REF", help="references, one per line, aligned with --sys")
    p.add_argument("--json", metavar="OUT", help="also write the scores as JSON to OUT")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def _add_choice_args(parser: argparse.ArgumentParser, dest: str, name: str) -> None:
    """Add the flags of the chosen task / optimizer / lr scheduler."""
    import seqtrain.tasks  # noqa: F401  (registers tasks)
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


def _other_cli_flags(stage: str | None, choices: argparse.Namespace) -> dict[str, argparse.Action]:
    """The flags of the other CLI (generate's for training, train's for generation), keyed as config keys: a
    preset holds both, and each CLI skips the other's keys. Training flags follow the config's components."""
    try:
        if stage == "train":
            other = get_generation_parser()
            _add_choice_args(other, "task", choices.task)
        elif stage == "generate":
            other = get_training_parser()
            for dest in ("task", "optimizer", "lr_scheduler"):
                _add_choice_args(other, dest, getattr(choices, dest))
        else:
            return {}
    except SeqtrainError:  # an unknown component is reported by the parser that owns it
        return {}
    return actions_by_key(other)


def parse_train_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """seqtrain-train's flags, parsed (`argv` defaults to sys.argv[1:])."""
    return parse_args_and_arch(get_training_parser(), argv)


def parse_generation_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """seqtrain-generate's flags, parsed; --config FILE supplies defaults, as in seqtrain-train."""
    return parse_args_and_arch(get_generation_parser(), argv)


def parse_args_and_arch(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse `argv` with `parser` once the chosen components added their flags; then apply the arch preset."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
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
            from seqtrain.registry import ARCHS

            if first.arch not in ARCHS:
                raise SeqtrainError(
                    f"--arch: unknown arch {first.arch!r}; choose from: {', '.join(ARCHS.names())}"
                )
    _order_groups(parser)
    if first.config:
        apply_config(parser, first.config, config, lines, ignore=_other_cli_flags(stage, first))

    args = parser.parse_args(argv)
    if stage == "train":
        from seqtrain.registry import ARCHS

        if not args.arch:
            raise SeqtrainError(f"--arch is required; choose from: {', '.join(ARCHS.names())}")
        ARCHS.get(args.arch)(args)  # fills only fields still None: explicit flags and config values win
    # fairseq: the memory-efficient variants imply the plain ones (seqtrain keeps fp32 master weights for both)
    if getattr(args, "memory_efficient_fp16", False):
        args.fp16 = True
    if getattr(args, "memory_efficient_bf16", False):
        args.bf16 = True
    if hasattr(args, "_stage"):
        del args._stage
    if getattr(args, "config", None):
        args.config = os.path.abspath(args.config)
    return args
