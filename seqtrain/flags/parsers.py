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
from collections.abc import Sequence
from typing import Any

from seqtrain import distributed
from seqtrain.config import add_settings, int_list, setting, settings
from seqtrain.cuda import Bf16ModeConfig, DeviceConfig
from seqtrain.data import options as data_options
from seqtrain.data.indexed_dataset import DataCheckConfig
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value
from seqtrain.flags import fairseq_compat
from seqtrain.flags.config_file import actions_by_key, apply_config, config_text, load_config
from seqtrain.flags.generation import add_generation_args
from seqtrain.flags.preprocess import add_args as add_preprocess_args
from seqtrain.flags.rouge import add_args as add_rouge_args
from seqtrain.logging.progress import LoggingConfig
from seqtrain.logging.trackers import TrackingConfig
from seqtrain.optim import OptimizationConfig
from seqtrain.optim.ema import EmaConfig
from seqtrain.registry import ARCHS

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


def add_common_args(parser: argparse.ArgumentParser) -> None:
    g = add_settings(parser, ConfigFileSettings, "Common")
    for cls in (DeviceConfig, DebugSettings, DataCheckConfig):
        add_settings(parser, cls, group=g)


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    add_settings(parser, LoggingConfig, "Logging")


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


_LORA_BASE_HELP = (
    "the base model of an adapters-only LoRA checkpoint (--save-adapters-only), when it is no longer at the "
    "path stored in it; its weights must be the ones the adapters were trained on (checked by sha256)"
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
    add_rouge_args(parser, dataset)
    add_freeze_args(parser)
    add_ema_args(parser)
    add_checkpoint_args(parser)
    add_distributed_args(parser)
    add_tracking_args(parser)
    fairseq_compat.add_args(parser)
    parser.set_defaults(_stage="train")
    _order_groups(parser)
    return parser


def _generation_base_parser(default_task: str = "translation") -> argparse.ArgumentParser:
    """The flags seqtrain-generate shares with seqtrain-train (common, dataset, checkpoint, distributed)."""
    parser = get_parser("Generate with a trained model (fairseq-compatible flags).", default_task)
    _retitle(data_options.add_dataset_args(parser, train=False, gen=True), "Dataset and batching")
    g = parser.add_argument_group("Checkpoint")
    g.add_argument(
        "--path",
        metavar="FILE",
        help="checkpoint to generate with: a file, a Hugging Face folder, or a hub name org/name[@revision]",
    )
    g.add_argument("--results-path", default=None, metavar="DIR", help="write generate-{split}.txt here")
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
    g.add_argument("--lora-base", metavar="PATH", help=_LORA_BASE_HELP)
    add_distributed_args(parser)
    fairseq_compat.add_args(parser)
    parser.set_defaults(_stage="generate")
    _order_groups(parser)
    return parser


def get_generation_parser(default_task: str = "translation") -> argparse.ArgumentParser:
    """The seqtrain-generate parser before the chosen task's flags (parse_args_and_arch adds those)."""
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
        "--score-reference",
        action="store_true",
        help="score the references instead of generating: H-/P- lines give the model's log-probabilities of "
        "the target (fairseq's SequenceScorer)",
    )
    # fairseq-generate's task flags: sources (and targets) are cut or filtered at the smaller of these and the
    # model's own maximum, as fairseq's resolve_max_positions does
    for side in ("source", "target"):
        g.add_argument(
            f"--max-{side}-positions",
            type=int,
            default=1024,
            metavar="N",
            help=f"max {side} length; the model's own maximum applies when smaller",
        )
    g.add_argument(
        "--model-overrides",
        default="{}",
        metavar="JSON",
        help="model args to override, e.g. '{\"dropout\": 0.0}'",
    )
    g.add_argument(
        "--compute-type",
        default="default",
        choices=["default", "auto", "float32", "int8"],
        help="as CTranslate2's --compute-type: int8 quantizes the linear layers' weights (per channel) and, per "
        "step, their inputs (the CPU only; faster, close to fp32's summaries); auto is int8 on a CPU that "
        "supports it, else default; default and float32: the weights as loaded (with --fp16 / --bf16 as given)",
    )
    _add_generation_output_args(parser, g)
    _order_groups(parser)
    return parser


# Flags the shared groups give seqtrain-generate that do nothing there: refused with one line (a --config
# file may still hold them: presets carry training and generation keys together).
GENERATION_REFUSED = (
    "--compile",
    "--tensorboard-logdir",
    "--peak-flops",
    "--profile",
    "--num-workers",
    "--fp16-init-scale",
    "--fp16-scale-window",
    "--fp16-scale-tolerance",
    "--min-loss-scale",
    "--threshold-loss-scale",
    "--distributed-world-size",
    "--distributed-rank",
    "--distributed-backend",
    "--distributed-timeout",
    "--distributed-init-method",
    "--distributed-port",
    "--device-id",
    "--distributed-no-spawn",
    "--ddp-backend",
    "--bucket-cap-mb",
    "--find-unused-parameters",
)
# ... and those seqtrain-interactive refuses on top (it answers on stdout, from stdin)
INTERACTIVE_REFUSED = (
    "--results-path",
    "--scoring",
    "--reference",
    "--gen-subset",
    "--output",
    "--num-shards",
    "--shard-id",
    "--prefix-size",
    "--score-reference",
    "--rerank",
    "--rerank-lenpen",
)


def _add_generation_output_args(parser: argparse.ArgumentParser, g: Any) -> None:
    """seqtrain-generate's output, sharding and interactive flags, in one block."""
    g.add_argument(
        "--output",
        default=None,
        metavar="FILE",
        help="write the summaries (or fairseq lines) to FILE instead of stdout, atomically",
    )
    g.add_argument(
        "--output-format",
        default=None,
        choices=["text", "fairseq"],
        help="text: one detokenized summary per input line, in input order (--nbest lines each); fairseq: "
        "S-/T-/H-/D-/P- lines in batch order (default: text with --input, fairseq for a data-bin split)",
    )
    g.add_argument(
        "--num-shards",
        default=1,
        type=int,
        metavar="N",
        help="split the examples into N contiguous shards and generate only --shard-id's (as fairseq)",
    )
    g.add_argument("--shard-id", default=0, type=int, metavar="ID", help="the shard to generate, 0-based")
    g.add_argument(
        "--rerank",
        default=None,
        choices=["length", "mbr"],
        help="reorder each example's finished beam before output: length (summed log-probs / len**--rerank-lenpen)"
        " or mbr (minimum Bayes risk: the hypothesis with the highest mean ROUGE against the others)",
    )
    g.add_argument(
        "--rerank-lenpen",
        default=None,
        type=float,
        metavar="A",
        help="with --rerank length: the length exponent A (default: 1.0; equal to --lenpen: the beam's own order)",
    )
    refused = set(GENERATION_REFUSED)
    for action in parser._actions:
        if refused & set(action.option_strings):
            action.help = argparse.SUPPRESS


def get_preprocessing_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="seqtrain-preprocess",
        description="Tokenize, build dictionaries and binarize parallel text into a fairseq-style data-bin.",
    )
    return add_negations(add_preprocess_args(parser))


def get_convert_parser() -> argparse.ArgumentParser:
    from seqtrain.checkpoint.formats import FORMATS  # imports torch: only seqtrain-convert's parser needs it

    p = ArgumentParser(
        prog="seqtrain-convert",
        description="Convert a BART checkpoint between seqtrain, fairseq and Hugging Face formats.",
    )
    p.add_argument(
        "input",
        help="checkpoint file (seqtrain / fairseq), Hugging Face model folder, or hub name org/name[@revision]",
    )
    p.add_argument("output", help="output file (--to seqtrain / fairseq) or folder (--to hf)")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument(
        "--ema",
        action="store_true",
        help="export the EMA of the weights a --store-ema run kept (extra_state['ema']) instead of the weights",
    )
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
    p.add_argument(
        "--resize-vocab",
        action="store_true",
        help=_RESIZE_VOCAB_HELP,
    )
    p.add_argument("--lora-base", metavar="PATH", help=_LORA_BASE_HELP)
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="store the weights in this type (default: as they are; float16 halves the file, as the released "
        "models ship; seqtrain, fairseq and transformers load them into float32 models)",
    )
    g = p.add_argument_group(
        "generation_config.json (--to hf)",
        "the search transformers' generate() runs by default; each flag not given comes from the input (a "
        "run's --eval-rouge-args, a Hugging Face folder's generation_config.json), else seqtrain-generate's "
        "default",
    )
    g.add_argument("--beam", type=int, metavar="N", help="num_beams (default: 5)")
    g.add_argument("--lenpen", type=float, metavar="X", help="length_penalty (default: 1.0)")
    g.add_argument(
        "--max-len-b",
        type=int,
        metavar="N",
        help="at most N tokens before </s>: max_length N + 2, capped at the model's positions (default: 200)",
    )
    g.add_argument("--min-len", type=int, metavar="N", help="min_length N + 1 (default: 1)")
    g.add_argument("--no-repeat-ngram-size", type=int, metavar="N", help="no_repeat_ngram_size (default: 0)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return add_negations(p)


def get_average_parser() -> argparse.ArgumentParser:
    """seqtrain-average-checkpoints: fairseq's scripts/average_checkpoints.py flags."""
    p = ArgumentParser(
        prog="seqtrain-average-checkpoints",
        description="Average the parameters of checkpoints (seqtrain or fairseq) into a new checkpoint.",
    )
    p.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint files, or one folder with --num-epoch-checkpoints / --num-update-checkpoints",
    )
    p.add_argument("--output", required=True, metavar="FILE", help="write the averaged checkpoint here")
    n = p.add_mutually_exclusive_group()
    n.add_argument(
        "--num-epoch-checkpoints",
        type=int,
        metavar="N",
        help="average the N newest checkpoint{E}.pt in the --inputs folder",
    )
    n.add_argument(
        "--num-update-checkpoints",
        type=int,
        metavar="N",
        help="average the N newest checkpoint_{E}_{U}.pt in the --inputs folder",
    )
    p.add_argument(
        "--checkpoint-upper-bound",
        type=int,
        metavar="N",
        help="with --num-*-checkpoints: only epochs (or updates) up to N; e.g. --num-epoch-checkpoints 10 "
        "--checkpoint-upper-bound 50 averages checkpoints 41-50",
    )
    p.add_argument(
        "--unsafe-load",
        action="store_true",
        help="allow arbitrary unpickling of the inputs (may run code; only for trusted files)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return add_negations(p)


def get_score_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="seqtrain-score",
        description="ROUGE F1 x 100 (rouge-score, Porter stemming) averaged over lines; ROUGE-Lsum splits "
        "sentences at '.', '!', '?' followed by whitespace.",
    )
    p.add_argument("--sys", required=True, metavar="HYP", help="hypotheses, one per line")
    p.add_argument("--ref", required=True, metavar="REF", help="references, one per line, aligned with --sys")
    p.add_argument("--json", metavar="OUT", help="also write the scores as JSON to OUT")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        metavar="N",
        help="also print 95%% percentile-bootstrap confidence intervals of each ROUGE figure from N resamples "
        "of the examples (0: off; 1000 is usual)",
    )
    p.add_argument(
        "--compare",
        metavar="OTHER",
        help="paired bootstrap test of --sys against the hypotheses OTHER on the same --ref: the fraction of "
        "resamples where --sys scores higher and a two-sided p-value (N from --bootstrap, else 1000)",
    )
    p.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the resampling (default: 1)")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return add_negations(p)


def get_eval_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="seqtrain-eval",
        description="One report of a summarization system on a split, as JSON and a self-contained HTML page: "
        "ROUGE with bootstrap intervals beside lead-k and an extractive oracle, lengths, ROUGE by source length, "
        "a faithfulness proxy, truncation, train/split near-duplicates, the worst and best examples, plots.",
    )
    g = p.add_argument_group("inputs")
    g.add_argument(
        "--hyps",
        required=True,
        metavar="PATH",
        help="the hypotheses: a file of lines, or a seqtrain-generate --results-path folder (its "
        "hypotheses-SPLIT.txt)",
    )
    g.add_argument("--source", required=True, metavar="FILE", help="the split's sources, one per line")
    g.add_argument("--reference", required=True, metavar="FILE", help="the split's references, one per line")
    g.add_argument(
        "--split",
        metavar="NAME",
        help="with a --results-path folder: which hypotheses-NAME.txt (default: the only one there)",
    )
    g.add_argument(
        "--train-source",
        metavar="FILE",
        help="train's sources, one per line: count sources of the split that train holds (exact and high-overlap)",
    )
    g.add_argument(
        "--train-log",
        metavar="FILE",
        help="a training log (--log-format json, or a --jsonl-log file): plot its validation curves",
    )
    g.add_argument(
        "--compare",
        metavar="OTHER",
        help="a second system's hypotheses (file or folder): the paired bootstrap test and per-bucket differences",
    )
    g = p.add_argument_group("report")
    g.add_argument("--json", metavar="OUT", help="write the report as JSON to OUT")
    g.add_argument("--html", metavar="OUT", help="write the report as one self-contained HTML page to OUT")
    g.add_argument("--title", metavar="TEXT", help="the page's title (default: the hypotheses' path)")
    g.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="resamples of the bootstrap intervals and test",
    )
    g.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the resampling (default: 1)")
    g.add_argument(
        "--lead",
        type=int_list,
        default=[1, 2, 3],
        metavar="K,...",
        help="lead-k baselines: first k sentences",
    )
    g.add_argument("--buckets", type=int, default=4, metavar="N", help="source-length buckets (quantiles)")
    g.add_argument(
        "--source-limit",
        type=int,
        default=1024,
        metavar="WORDS",
        help="the source truncation limit in words (ROUGE's tokens): how much of each reference lies past it "
        "(a model's --max-source-positions counts subword pieces; 1024 pieces are roughly 750 words)",
    )
    g.add_argument(
        "--dup-threshold",
        type=float,
        default=0.8,
        metavar="F",
        help="a source is a high-overlap duplicate when this share of its word 5-grams is in one train source",
    )
    g.add_argument("--examples", type=int, default=5, metavar="N", help="the N worst and best examples shown")
    g.add_argument("--debug", action="store_true", help="show tracebacks on errors")
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
    """seqtrain-train's flags, parsed (`argv` defaults to sys.argv[1:]); --user-dir is imported first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    fairseq_compat.import_user_dir_of(argv)
    return parse_args_and_arch(get_training_parser(), argv)


def parse_generation_args(
    argv: Sequence[str] | None = None,
    interactive: bool = False,
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    """seqtrain-generate's (or seqtrain-interactive's, or `parser`'s: seqtrain-tune's) flags, parsed; --config
    FILE supplies defaults, as in seqtrain-train. Flags that do nothing there are refused; `given_flags` lists the
    dests set on the command line or in --config (they win over the generation defaults a model ships)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    fairseq_compat.import_user_dir_of(argv)
    parser = parser or (get_interactive_parser() if interactive else get_generation_parser())
    refused = GENERATION_REFUSED + (INTERACTIVE_REFUSED if interactive else ())
    for arg in argv:
        if arg == "--":
            break
        if arg.split("=", 1)[0] in refused:
            raise UsageError(f"{arg.split('=', 1)[0]}: does nothing in {parser.prog}; remove it")
    args = parse_args_and_arch(parser, argv)
    given = {a.dest for a in parser._actions if set(a.option_strings) & {x.split("=", 1)[0] for x in argv}}
    if args.config:
        config, _ = load_config(args.config)
        given |= {str(k).lstrip("-").replace("-", "_") for k in config}
    args.given_flags = sorted(given)
    return args


def get_tune_parser() -> argparse.ArgumentParser:
    """seqtrain-tune's parser: seqtrain-generate's, plus the search's flags (seqtrain.flags.tune)."""
    from seqtrain.flags.tune import add_tune_args  # seqtrain-tune's own module: read when its parser is built

    parser = get_generation_parser()
    parser.prog = "seqtrain-tune"
    parser.description = (
        "Choose generation settings (beam, lenpen, min-len, max-len-b, no-repeat-ngram-size) on a validation "
        "sample by ROUGE; write them as a --config preset and a generation_config.json, and measure the gain "
        "over the given settings on the whole split."
    )
    add_tune_args(parser)
    return parser


def get_interactive_parser() -> argparse.ArgumentParser:
    """seqtrain-interactive's parser: seqtrain-generate's, reading stdin by default."""
    parser = get_generation_parser()
    parser.prog = "seqtrain-interactive"
    parser.description = (
        "Summarize text read line by line (fairseq-interactive's flags): each buffer is answered as soon as it "
        "is full or the input ends."
    )
    g = next(g for g in parser._action_groups if g.title == "Generation")
    g.add_argument(
        "--buffer-size",
        default=1,
        type=int,
        metavar="N",
        help="read N lines, then answer them together (default: 1)",
    )
    parser.set_defaults(input="-")
    refused = set(INTERACTIVE_REFUSED)
    for action in parser._actions:
        if refused & set(action.option_strings):
            action.help = argparse.SUPPRESS
    return parser


def parse_args_and_arch(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse `argv` with `parser` once the chosen components added their flags; then apply the arch preset."""
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
            if first.arch not in ARCHS:
                raise SeqtrainError(
                    f"--arch: unknown arch {first.arch!r}; choose from: {', '.join(ARCHS.names())}"
                )
    _order_groups(parser)
    add_negations(parser)
    if first.config:
        apply_config(parser, first.config, config, lines, ignore=_other_cli_flags(stage, first))

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
