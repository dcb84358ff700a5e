"""Write docs/flags.md from the programs' own argument parsers.

    PYTHONPATH=. python scripts/dev/gen_flags.py > docs/flags.md

One table per parser group (flag, default, help), in the order `--help` shows them; seqtrain-train's optimizer
and LR-scheduler groups are listed for every registered choice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

import seqtrain.tasks  # noqa: F401  (registers the tasks)
from seqtrain import registry
from seqtrain.config import left_out
from seqtrain.evaluation.report import get_eval_parser
from seqtrain.flags import parsers, parsing, tools, training
from seqtrain.generation import options
from seqtrain.optim import lr_scheduler, optimizers
from seqtrain.preprocess import options as preprocess_options
from seqtrain.serve import options as serve_options

CHOICE_FLAGS = {"--optimizer", "--lr", "--lr-scheduler"}
INTRO = """# Flag reference

Every flag of the command-line programs, with its default and help text, grouped as `--help` groups them.
The tables are generated from the programs' own argument parsers by `scripts/dev/gen_flags.py`; `PROG --help` prints
the same. Flag names are fairseq 0.12's wherever fairseq has the flag, and so are the defaults except where
[fairseq.md](fairseq.md)'s table says otherwise; a fairseq flag seqtrain lacks is refused, naming it.

Contents: [seqtrain-preprocess](#seqtrain-preprocess) · [seqtrain-train](#seqtrain-train) ·
[seqtrain-generate](#seqtrain-generate) · [seqtrain-interactive](#seqtrain-interactive) ·
[seqtrain-convert](#seqtrain-convert) ·
[seqtrain-average-checkpoints](#seqtrain-average-checkpoints) · [seqtrain-score](#seqtrain-score) ·
[seqtrain-eval](#seqtrain-eval) · [seqtrain-tune](#seqtrain-tune) · [seqtrain-serve](#seqtrain-serve)

Precedence, highest first: the command line, then `--config FILE`, then the `--arch` preset, then the defaults
below. A config file holds `key: value` lines whose keys are these flag names (see
[the README's presets section](../README.md#presets-configs)).

## seqtrain-preprocess
"""
TRAIN = """## seqtrain-train

`seqtrain-train DATA --arch ARCH [flags]`. The flags of the chosen optimizer and learning-rate scheduler
appear in `--help` once they are chosen (`--lr-scheduler polynomial_decay --help`); all of them are listed
below.
"""
GENERATE = """## seqtrain-generate

`seqtrain-generate [DATA] --path CHECKPOINT [flags]` (DATA is optional with `--input`).
"""

INTERACTIVE = """## seqtrain-interactive

`seqtrain-interactive --path CHECKPOINT [flags]` reads documents from stdin (or `--input FILE`), one per line,
and answers each `--buffer-size` lines as soon as they are read. It takes seqtrain-generate's flags above,
except for these:
"""

TUNE = """## seqtrain-tune

`seqtrain-tune [DATA] --path CHECKPOINT --tune-output DIR [flags]` searches generation settings on a validation
sample ([generate.md](generate.md#tuning-the-settings-on-validation-seqtrain-tune)). It takes seqtrain-generate's
flags above (the given settings are the search's starting point and its baseline), except for these:
"""

SERVE = """## seqtrain-serve

`seqtrain-serve --path CHECKPOINT [flags]` answers `POST /v1/summarize` ([serve.md](serve.md)). It takes
seqtrain-generate's flags above (the generation flags are every request's defaults), except for these:
"""


def serve_tables(out: list[str]) -> None:
    """seqtrain-serve's own flags and the generate flags it refuses."""
    parser = serve_options.get_serve_parser()
    group = next(g for g in parser._action_groups if g.title == "Server")
    table("Its own flags", group._group_actions, out)
    out_flags = left_out(parser)
    generate = options.get_generation_parser()._actions
    refused = ", ".join(f"`{s}`" for a in generate for s in a.option_strings if s in out_flags)
    out.append(f"Refused (they name files, splits or line formats that a server has none of): {refused}.\n")


def tune_tables(out: list[str]) -> None:
    """seqtrain-tune's own flags, the generate flags whose default differs, and the ones it refuses."""
    generate = {a.dest: a for a in options.get_generation_parser()._actions}
    parser = options.get_tune_parser()
    group = next(g for g in parser._action_groups if g.title == "Tuning")
    changed = [
        a
        for a in parser._actions
        if a.dest in generate and a.help is not argparse.SUPPRESS and generate[a.dest].default != a.default
    ]
    table("Its own flags", group._group_actions, out)
    table("seqtrain-generate's flags with another default", changed, out)
    out_flags = left_out(parser)
    refused = ", ".join(f"`{s}`" for a in generate.values() for s in a.option_strings if s in out_flags)
    out.append(f"Refused (it scores every setting and writes its own files): {refused}.\n")


def interactive_tables(out: list[str]) -> None:
    """seqtrain-interactive's flags where they differ from seqtrain-generate's, and the ones it refuses."""
    generate = {tuple(a.option_strings): a for a in options.get_generation_parser()._actions}
    parser = options.get_interactive_parser()
    changed = [
        a
        for a in parser._actions
        if a.help is not argparse.SUPPRESS
        and (
            tuple(a.option_strings) not in generate or generate[tuple(a.option_strings)].default != a.default
        )
    ]
    table("Its own flags and defaults", changed, out)
    refused = ", ".join(f"`{f}`" for f in options.refused_in_interactive())
    out.append(f"Refused (they name files or splits that interactive use has none of): {refused}.\n")


def fmt_default(a: argparse.Action) -> str:
    d = a.default
    if d is argparse.SUPPRESS or d is None:
        return ""
    if isinstance(a, argparse._StoreTrueAction):
        return "off"
    if isinstance(a, argparse._StoreFalseAction):
        return "on"
    if isinstance(d, list):
        d = ",".join(map(str, d))
    return f"`{d}`"


def fmt_help(a: argparse.Action) -> str:
    h = a.help or ""
    params = {k: ("==SUPPRESS==" if v is argparse.SUPPRESS else v) for k, v in vars(a).items()}
    params["prog"] = ""
    if isinstance(params.get("choices"), (list, tuple, set, dict)):
        params["choices"] = ", ".join(map(str, params["choices"]))
    try:
        h = h % params
    except (KeyError, TypeError, ValueError):
        pass
    h = " ".join(h.split())
    d = ",".join(map(str, a.default)) if isinstance(a.default, list) else a.default
    h = h.replace(f" (default: {d})", "")
    h = h.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    if a.choices and "choose" not in h and "{" not in h:
        h += f" (choices: {', '.join(map(str, a.choices))})"
    return h


def table(title: str, actions: Iterable[argparse.Action], out: list[str], skip: set = frozenset()) -> None:
    rows = []
    for a in actions:
        if isinstance(a, argparse._HelpAction) or a.help is argparse.SUPPRESS or set(a.option_strings) & skip:
            continue
        flag = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest.upper()}`"
        rows.append(f"| {flag} | {fmt_default(a)} | {fmt_help(a)} |")
    if rows:
        out += [f"### {title}\n", "| flag | default | meaning |", "|---|---|---|", *rows, ""]


def parser_tables(parser: argparse.ArgumentParser, out: list[str], skip: set = frozenset()) -> None:
    names = {"positional arguments": "Positional", "options": "General", "optional arguments": "General"}
    for g in parser._action_groups:
        table(names.get(g.title, g.title), g._group_actions, out, skip)


def choice_group(add_args, name: str) -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser, name)
    return parser._actions


def main() -> None:
    out = [INTRO]
    parser_tables(preprocess_options.get_preprocessing_parser(), out)
    out.append(TRAIN)
    parser = training.get_training_parser()
    parsing.add_choice_args(parser, "task", "translation")
    parsers._order_groups(parser)
    parser_tables(parser, out)
    parser = (
        training.get_training_parser()
    )  # the denoising task's own flags (its DATA is a monolingual data-bin)
    parsing.add_choice_args(parser, "task", "denoising")
    group = next(g for g in parser._action_groups if g.title == "Task (denoising)")
    table("Task `denoising` (`--task denoising`, BART pretraining)", group._group_actions, out)
    choice = [a for a in choice_group(optimizers.add_args, "adam") if a.dest in ("optimizer", "lr")]
    choice += [a for a in choice_group(lr_scheduler.add_args, "fixed") if a.dest == "lr_scheduler"]
    table("Optimizer and LR scheduler choice", choice, out)
    for name in registry.OPTIMIZERS.names():
        actions = choice_group(optimizers.add_args, name)
        table(f"Optimizer `{name}` (`--optimizer {name}`)", actions, out, CHOICE_FLAGS)
    for name in registry.LR_SCHEDULERS.names():
        actions = choice_group(lr_scheduler.add_args, name)
        table(f"LR scheduler `{name}` (`--lr-scheduler {name}`)", actions, out, CHOICE_FLAGS)

    out.append(GENERATE)
    parser = options.get_generation_parser()
    parsing.add_choice_args(parser, "task", "translation")
    parsers._order_groups(parser)
    parser_tables(parser, out)

    out.append(INTERACTIVE)
    interactive_tables(out)

    out.append("## seqtrain-convert\n")
    parser_tables(tools.get_convert_parser(), out)
    out.append("## seqtrain-average-checkpoints\n")
    parser_tables(tools.get_average_parser(), out)
    out.append("## seqtrain-score\n")
    parser_tables(tools.get_score_parser(), out)
    out.append("## seqtrain-eval\n")
    parser_tables(get_eval_parser(), out)
    out.append(TUNE)
    tune_tables(out)
    out.append(SERVE)
    serve_tables(out)
    sys.stdout.write("\n".join(out).rstrip() + "\n")


if __name__ == "__main__":
    main()
