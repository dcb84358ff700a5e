"""The --eval-rouge flags of seqtrain-train, and the generation settings --eval-rouge-args describes.

--eval-rouge-args takes JSON with generation flag names as keys ('{"beam": 4, "max_len_b": 30}') or the flags
themselves ('--beam 4 --max-len-b 30'); unset ones keep seqtrain-generate's defaults, and the result is checked
as seqtrain-generate checks its flags. The validation itself is `seqtrain.train.rouge_validation`.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from seqtrain.config import add_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import loads_bounded
from seqtrain.flag_bounds import Bounds
from seqtrain.flags.generation import add_generation_args, check_generation_args


@settings
class RougeValidationConfig:
    """Validation with generation (ROUGE): seqtrain-train's --eval-rouge (seqtrain.train.rouge_validation)"""

    eval_rouge: bool = setting(
        False,
        "generate for the validation subsets and log ROUGE (rouge1, rouge2, rouge_l, rouge_lsum, "
        "F1 x 100); pick checkpoints with --best-checkpoint-metric rouge_l "
        "--maximize-best-checkpoint-metric",
        action="store_true",
    )
    eval_rouge_args: str = setting(
        "{}",
        'generation settings for --eval-rouge: JSON (\'{"beam": 4, "max_len_b": 30}\') or '
        "seqtrain-generate flags ('--beam 4 --max-len-b 30') (default: generate's defaults)",
        metavar="JSON_OR_FLAGS",
    )
    eval_rouge_bootstrap: int = setting(
        0,
        "also log 95%% percentile-bootstrap confidence intervals of each ROUGE figure from N resamples of "
        "the validation examples, seeded with --seed (rouge_l_lo, rouge_l_hi, ...; the figures seqtrain-score "
        "--bootstrap N --seed S gives on the same hypotheses; 0: off)",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1_000_000),  # resamples (0: off)
    )
    eval_rouge_print_samples: bool = setting(
        False, "log the first hypothesis and reference of every validation batch", action="store_true"
    )


def add_args(parser: argparse.ArgumentParser, group: Any = None) -> Any:
    """The --eval-rouge flags, into `group` (seqtrain-train: the validation flags' group) or a new group."""
    return add_settings(parser, RougeValidationConfig, group=group)


def _generation_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="--eval-rouge-args", add_help=False, allow_abbrev=False)
    add_generation_args(parser)
    return parser


def generation_args(text: str, seed: int = 1) -> argparse.Namespace:
    """The generation settings --eval-rouge-args describes (JSON object or flags), on top of the defaults."""
    parser = _generation_parser()
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
    args.seed = seed
    try:
        check_generation_args(args)
    except SeqtrainError as e:
        raise SeqtrainError(f"--eval-rouge-args: {e}") from None
    return args
