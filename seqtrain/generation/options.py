"""The parsers of seqtrain-generate and seqtrain-interactive, composed by the programs from the settings groups
they use (fairseq's flag names and defaults), and the generation settings --eval-rouge-args describes.

seqtrain-generate takes the common, logging and dataset flags it shares with seqtrain-train, then its own
groups, each declared beside its code: where the checkpoint comes from (runner.CheckpointLoadConfig), the search
(search.GenerationConfig), input and scoring (program.InputConfig), output and sharding (output.OutputConfig),
reranking (rerank.RerankConfig); seqtrain-interactive the same for its program, plus interactive.InteractiveConfig.
A setting that does nothing in a program (`not_in=`) and the training groups fairseq-generate accepts but
generation has no use for (distributed training, fp16 loss scaling) are left out of its parser: given on the
command line, each is refused with one line naming it; in a --config file it is skipped, as every key of the
other programs is (a preset serves training and generation).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence

from seqtrain.checkpoint.generation_settings import STORED, StoredGeneration, make_stored
from seqtrain.config import add_settings, leave_out, left_out
from seqtrain.data import options as data_options
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import loads_bounded
from seqtrain.flags import fairseq_compat, parsers, parsing, training
from seqtrain.flags.config_file import actions_by_key, config_values, load_config
from seqtrain.generation.interactive import InteractiveConfig
from seqtrain.generation.output import OutputConfig
from seqtrain.generation.program import InputConfig
from seqtrain.generation.rerank import RerankConfig
from seqtrain.generation.runner import CheckpointLoadConfig
from seqtrain.generation.search import GenerationConfig, check_generation_args
from seqtrain.generation.tune_flags import add_tune_args


def _leave_out_group(
    parser: argparse.ArgumentParser, add: Callable[[argparse.ArgumentParser], object]
) -> None:
    """A training group fairseq-generate accepts and generation has no use for: its flags are left out."""
    scratch = argparse.ArgumentParser(add_help=False)
    add(scratch)
    for action in scratch._actions:
        parser.set_defaults(**{action.dest: action.default})
        leave_out(parser, action.option_strings, action.dest)


def get_generation_parser(
    default_task: str = "translation", program: str = "generate"
) -> argparse.ArgumentParser:
    """seqtrain-generate's parser (`program` "interactive": seqtrain-interactive's) before the chosen task's
    flags (parse_args_and_arch adds those)."""
    parser = parsers.ArgumentParser(
        description="Generate with a trained model (fairseq-compatible flags).",
        allow_abbrev=False,
        formatter_class=parsers.HelpFormatter,
    )
    parsers.add_common_args(parser, program)
    common = next(g for g in parser._action_groups if g.title == "Common")
    common.add_argument("--task", default=default_task, metavar="TASK", help="task (default: %(default)s)")
    _leave_out_group(parser, training.add_loss_scaling_args)
    parsers.add_logging_args(parser, program)
    dataset = data_options.add_dataset_args(parser, train=False, gen=True, program=program)
    parsers._retitle(dataset, "Dataset and batching")
    add_settings(parser, CheckpointLoadConfig, "Checkpoint", program=program)
    _leave_out_group(parser, parsers.add_distributed_args)
    fairseq_compat.add_args(parser)
    parser.set_defaults(_stage="generate")
    parser.prog = f"seqtrain-{program}"
    parser.add_argument(
        "data",
        nargs="?",
        default=None,
        metavar="DATA",
        help="data-bin folder (optional with --input when the checkpoint carries its tokenizer)",
    )
    g = add_settings(parser, GenerationConfig, "Generation", program=program)
    for cls in (InputConfig, OutputConfig, RerankConfig):
        add_settings(parser, cls, group=g, program=program)
    parsers._order_groups(parser)
    return parser


def get_interactive_parser() -> argparse.ArgumentParser:
    """seqtrain-interactive's parser: seqtrain-generate's groups less what needs files or splits, reading stdin
    by default, plus --buffer-size."""
    parser = get_generation_parser(program="interactive")
    parser.description = (
        "Summarize text read line by line (fairseq-interactive's flags): each buffer is answered as soon as it "
        "is full or the input ends."
    )
    g = next(g for g in parser._action_groups if g.title == "Generation")
    add_settings(parser, InteractiveConfig, group=g, program="interactive")
    parser.set_defaults(input="-")
    return parser


def _other_programs_flags(interactive: bool) -> Callable[[argparse.Namespace], dict[str, argparse.Action]]:
    """The config keys generation skips: seqtrain-train's (for the config's components), and for
    seqtrain-interactive seqtrain-generate's too."""

    def flags(choices: argparse.Namespace) -> dict[str, argparse.Action]:
        out = training.training_flags(choices)
        if interactive:
            out.update(generation_flags(choices))
        return out

    return flags


def generation_flags(choices: argparse.Namespace) -> dict[str, argparse.Action]:
    """seqtrain-generate's flags keyed as config keys (those seqtrain-train skips in a preset)."""
    try:
        other = get_generation_parser()
        parsing.add_choice_args(other, "task", choices.task)
    except SeqtrainError:  # an unknown component is reported by the parser that owns it
        return {}
    return actions_by_key(other)


def parse_generation_args(
    argv: Sequence[str] | None = None,
    interactive: bool = False,
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    """seqtrain-generate's (or seqtrain-interactive's, or `parser`'s: seqtrain-tune's) flags, parsed; --config
    FILE supplies defaults, as in seqtrain-train. `given_flags` lists the dests set on the command line or in
    --config (they win over the generation defaults a model ships)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    fairseq_compat.import_user_dir_of(argv)
    parser = parser or (get_interactive_parser() if interactive else get_generation_parser())
    args = parsing.parse_args_and_arch(parser, argv, other_flags=_other_programs_flags(interactive))
    given = {a.dest for a in parser._actions if set(a.option_strings) & {x.split("=", 1)[0] for x in argv}}
    if args.config:
        config, _, _ = load_config(args.config)
        given |= {str(k).lstrip("-").replace("-", "_") for k in config}
    args.given_flags = sorted(given)
    return args


def preset_generation(config: str | None) -> StoredGeneration | None:
    """The generation settings a training run's --config preset names (beam, lenpen, lengths, n-gram blocking:
    what `seqtrain-generate --config FILE` would take from it), for its checkpoints to remember; None without a
    preset or without such keys. Values are checked as seqtrain-generate checks them."""
    if not config:
        return None
    values = config_values(get_generation_parser(), config, STORED)
    if not values:
        return None
    shown = os.path.relpath(config)
    shown = config if shown.startswith("..") else shown
    return make_stored(values, f"the training --config {shown}", f"--config {config}")


def get_tune_parser() -> argparse.ArgumentParser:
    """seqtrain-tune's parser: seqtrain-generate's, plus the search's flags (seqtrain.generation.tune_flags)."""
    parser = get_generation_parser(program="tune")  # the fields marked not_in "tune" are refused by name
    parser.description = (
        "Choose generation settings (beam, lenpen, min-len, max-len-b, no-repeat-ngram-size) on a validation "
        "sample by ROUGE; write them as a --config preset and a generation_config.json, and measure the gain "
        "over the given settings on the whole split."
    )
    add_tune_args(parser)
    return parser


def refused_in_interactive() -> list[str]:
    """seqtrain-generate's flags that seqtrain-interactive leaves out, in seqtrain-generate's order."""
    generate = get_generation_parser()
    out = left_out(get_interactive_parser())
    return [s for a in generate._actions for s in a.option_strings if s in out and s.startswith("--")]


# ------------------------------------------------------------------------------------------------- --eval-rouge
def _eval_rouge_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="--eval-rouge-args", add_help=False, allow_abbrev=False)
    add_settings(parser, GenerationConfig, "Generation")
    return parser


def generation_args(text: str, seed: int = 1) -> GenerationConfig:
    """The generation settings seqtrain-train's --eval-rouge-args describes (JSON object with generation flag
    names as keys, or the flags themselves), on top of seqtrain-generate's defaults, checked as seqtrain-generate
    checks its flags; as the search's typed settings."""
    parser = _eval_rouge_parser()
    text = (text or "").strip()
    if text.startswith("{") or not text:
        try:
            values = loads_bounded(text or "{}")  # nesting bounded: json.loads recursed into a RecursionError
        except ValueError as e:
            raise SeqtrainError(f"--eval-rouge-args: not valid JSON ({e})") from None
        if not isinstance(values, dict):
            raise SeqtrainError("--eval-rouge-args: expected a JSON object")
        args = parser.parse_args([])
        known = vars(args)
        # switches whose default (None) the device decides: --static-decoding, --packed-encoder
        switches = {a.dest for a in parser._actions if isinstance(a, argparse.BooleanOptionalAction)}
        for key, value in values.items():
            dest = str(key).lstrip("-").replace("-", "_")
            if dest not in known:
                raise SeqtrainError(
                    f"--eval-rouge-args: unknown generation setting {key!r}; choose from: "
                    f"{', '.join(sorted(known))}"
                )
            default = known[dest]
            if dest in switches and value is not None and not isinstance(value, bool):
                raise SeqtrainError(f"--eval-rouge-args: {key} must be true, false or null, got {value!r}")
            if isinstance(default, bool) and not isinstance(value, bool):
                raise SeqtrainError(f"--eval-rouge-args: {key} must be true or false, got {value!r}")
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise SeqtrainError(f"--eval-rouge-args: {key} must be a number, got {value!r}")
                if isinstance(default, float):
                    value = float(value)  # an int flag keeps a float, for check_generation_args to refuse
            setattr(args, dest, value)
    else:
        try:
            args, rest = parser.parse_known_args(shlex.split(text))
        except SystemExit:  # argparse already printed why
            raise SeqtrainError(f"--eval-rouge-args: cannot parse {text!r}") from None
        if rest:
            raise SeqtrainError(f"--eval-rouge-args: unknown generation flags {' '.join(rest)}")
    config = GenerationConfig(**vars(args), seed=seed)  # the values as given, for the check to see
    try:
        check_generation_args(config)
    except SeqtrainError as e:
        raise SeqtrainError(f"--eval-rouge-args: {e}") from None
    return config
