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

from seqtrain import distributed
from seqtrain.config import add_settings, left_out, setting, settings
from seqtrain.cuda import Bf16ModeConfig, DeviceConfig
from seqtrain.data import options as data_options
from seqtrain.data.indexed_dataset import DataCheckConfig
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.flags import fairseq_compat
from seqtrain.flags.config_file import actions_by_key, apply_config, config_text, load_config
from seqtrain.logging.progress import LoggingConfig
from seqtrain.logging.trackers import TrackingConfig
from seqtrain.optim import OptimizationConfig
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
# Each group is declared beside the code it configures, as a settings class (seqtrain.config); these functions
# only place the classes in the parsers, in fairseq's group order.
@settings
class ConfigFileSettings:
    """Common: a run's flags read from, or printed as, a config file (seqtrain.flags.config_file)"""

    config: str | None = setting(
        None,
        "YAML (or JSON) file of flag values (keys: flag names with - or _, at the top level or in "
        "sections); flags given on the command line override it",
        metavar="FILE",
    )
    print_config: bool = setting(
        False,
        "print the resolved flags (command line > --config > arch preset > defaults) as a YAML config "
        "file that reproduces the run, and exit",
        action="store_true",
    )


@settings
class DebugSettings:
    """Common: how the CLIs report a user error"""

    debug: bool = setting(False, "show full tracebacks for user errors", action="store_true")


def add_common_args(parser: argparse.ArgumentParser, program: str | None = None) -> None:
    g = add_settings(parser, ConfigFileSettings, "Common", program=program)
    for cls in (DeviceConfig, DebugSettings, DataCheckConfig):
        add_settings(parser, cls, group=g, program=program)


def add_logging_args(parser: argparse.ArgumentParser, program: str | None = None) -> None:
    add_settings(parser, LoggingConfig, "Logging", program=program)


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    """Experiment trackers of seqtrain-train (seqtrain.logging.trackers), in the Logging group."""
    add_settings(parser, TrackingConfig, group=next(g for g in parser._action_groups if g.title == "Logging"))


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    g = add_settings(parser, distributed.LaunchConfig, "Distributed training")
    add_settings(parser, distributed.DataParallelConfig, group=g)


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
    add_settings(parser, Bf16ModeConfig, group=common)
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
