"""Parsing a program's command line in fairseq's two stages: the component choices first (--task, --arch,
--criterion, --optimizer, --lr-scheduler), then the chosen components add their flags and the whole line is
parsed. Every program that takes a task parses with it (seqtrain.flags.training, seqtrain.generation.options).

Precedence, highest first: flags on the command line > `--config FILE` values (seqtrain.flags.config_file) > the
`--arch` preset > each flag's default. The arch preset runs last and only fills model fields still unset (None),
so explicit flags and config values win over it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from seqtrain import registry
from seqtrain.config import add_settings, left_out
from seqtrain.errors import SeqtrainError
from seqtrain.flags import fairseq_compat
from seqtrain.flags.config_file import actions_by_key, apply_config, check_sections, config_text, load_config
from seqtrain.flags.parsers import ArgumentParser, UsageError, _order_groups, add_negations

# The flags that pick a component; their values decide which further flags exist.
_CHOICE_FLAGS = (("--task",), ("--arch", "-a"), ("--criterion",), ("--optimizer",), ("--lr-scheduler",))
# Each choice's registry: the chosen component's settings class is REGISTRY.config(name), whose flags the parser
# adds and into which the program reads them (seqtrain.registry).
CHOICES = {
    "task": registry.TASKS,
    "arch": registry.ARCHS,
    "criterion": registry.CRITERIONS,
    "optimizer": registry.OPTIMIZERS,
    "lr_scheduler": registry.LR_SCHEDULERS,
}
# The choices whose flags a program's parser adds once the command line names them, in this order (seqtrain-train's
# criteria and model flags are every criterion's and arch's, added with the training parser: --help lists them).
PER_CHOICE = {"train": ("task", "optimizer", "lr_scheduler")}  # the other programs: the task's


def check_choice(dest: str, name: str) -> None:
    """An unknown component `name` for --dest is one line naming the choices."""
    table = CHOICES[dest]
    if name not in table:
        raise SeqtrainError(
            f"--{dest.replace('_', '-')}: unknown {table.kind} {name!r}; choose from: {', '.join(table.names())}"
        )


def add_choice_args(parser: argparse.ArgumentParser, dest: str, name: str) -> None:
    """Add the flags of component `name` chosen by --dest (task, optimizer, lr_scheduler): the settings class
    its registry holds for it."""
    # these import torch and register the tasks, optimizers and schedulers; parsing needs them from here on
    import seqtrain.tasks  # noqa: F401
    from seqtrain.optim import lr_scheduler, optimizers

    check_choice(dest, name)
    if dest == "optimizer":
        optimizers.add_args(parser, name)
    elif dest == "lr_scheduler":
        lr_scheduler.add_args(parser, name)
    else:
        cls = registry.TASKS.get(name)
        # a CLI that declared DATA itself (seqtrain-generate: optional with --input) keeps its own
        if not any(a.dest == "data" for a in parser._actions):
            if registry.TASKS.registered_config(name) is None and hasattr(cls, "add_args"):
                cls.add_args(parser)  # a --user-dir task written fairseq-style declares its flags itself
            else:
                add_settings(parser, registry.TASKS.config(name))
        if hasattr(cls, "add_task_flags"):  # the task's own flags, beside DATA: every CLI takes them
            cls.add_task_flags(parser)


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


def _check_component_names(
    path: str, config: dict[str, Any], lines: dict[str, int], dests: tuple[str, ...]
) -> None:
    """A config's --arch, --task, --optimizer and --lr-scheduler (those of `dests`) name registered components,
    in every program: a generation program skips training's keys (one preset serves both) but `arch:
    no_such_arch` passed through it silently. The error names the file, line and key, as the config's others."""
    # here, as add_choice_args does: they import torch and register the tasks (and archs), optimizers, schedulers
    import seqtrain.tasks  # noqa: F401
    from seqtrain.optim import lr_scheduler, optimizers  # noqa: F401

    for key, name in config.items():
        bare = key.lstrip("-").replace("-", "_")
        dest = "arch" if bare == "a" else bare
        table = CHOICES.get(dest) if dest in dests else None
        if table is None or name is None or (isinstance(name, str) and name in table):
            continue
        where = f"--config {path}" + (f" line {lines[key]}" if lines.get(key) else "") + f" ({key})"
        raise SeqtrainError(
            f"{where}: unknown {table.kind} {name!r}; choose from: {', '.join(table.names())}"
        )


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
    sections: dict[str, int] = {}
    ignore: dict[str, argparse.Action] = {}
    if first.config:
        config, lines, sections = load_config(first.config)
        for dest in ("task", "arch", "criterion", "optimizer", "lr_scheduler"):
            if _config_value(config, dest) is not None:
                defaults[dest] = _config_value(config, dest)
        first = _pre_parse(argv, defaults)
        ignore = other_flags(first) if other_flags is not None else {}
        # before the components are looked up (again in apply_config, with the chosen components' flags)
        check_sections(first.config, sections, actions_by_key(parser), ignore)
        _check_component_names(first.config, config, lines, ("task", "optimizer", "lr_scheduler"))

    for dest in PER_CHOICE.get(stage, ("task",)):
        add_choice_args(parser, dest, getattr(first, dest))
    _order_groups(parser)
    add_negations(parser)
    if first.config:
        apply_config(parser, first.config, config, lines, ignore=ignore, sections=sections)
        _check_component_names(first.config, config, lines, ("arch",))
    if stage == "train" and first.arch is not None:
        check_choice("arch", first.arch)

    args = parser.parse_args(argv)
    if stage == "train":
        if not args.arch:
            raise SeqtrainError(f"--arch is required; choose from: {', '.join(registry.ARCHS.names())}")
        # the preset fills only the fields still None: explicit flags and config values win
        registry.ARCHS.get(args.arch)(args)
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
