"""The pieces every program's parser is made of: seqtrain's ArgumentParser (one-line usage errors, ranges checked as
values are parsed), switches with a negative form, the help formatter, the groups several programs share
(common, logging, distributed) and the order of the groups in --help.

The programs compose their parsers from these and the settings classes beside their code
(seqtrain.flags.training, seqtrain.generation.options, ...); seqtrain.flags.parsing parses with them.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any

from seqtrain import distributed
from seqtrain.config import add_settings, setting, settings
from seqtrain.cuda import DeviceConfig
from seqtrain.data.indexed_dataset import DataCheckConfig
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.flags import fairseq_compat
from seqtrain.logging.progress import LoggingConfig


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


# ------------------------------------------------------------------------------------------------- flag groups
# Each group is declared beside the code it configures, as a settings class (seqtrain.config); these functions
# only place the classes in the parsers, in fairseq's group order (training's own: seqtrain.flags.training).
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


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    g = add_settings(parser, distributed.LaunchConfig, "Distributed training")
    add_settings(parser, distributed.DataParallelConfig, group=g)


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
