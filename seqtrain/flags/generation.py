"""Generation flags, with fairseq's names and defaults (`fairseq-generate --beam 5 --lenpen 1 ...`), and the one
check of generation settings (check_generation_args) that every source of them goes through."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import check_value


def add_generation_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("Generation")
    add = group.add_argument
    add("--beam", default=5, type=int, metavar="N", help="beam size (default: 5)")
    add(
        "--nbest",
        default=1,
        type=int,
        metavar="N",
        help="number of hypotheses to output per sentence (default: 1)",
    )
    add(
        "--max-len-a",
        default=0,
        type=float,
        metavar="N",
        help="generate sequences of at most a*x + b tokens, x the source length (default: a=0)",
    )
    add("--max-len-b", default=200, type=int, metavar="N", help="see --max-len-a (default: b=200)")
    add(
        "--min-len",
        default=1,
        type=int,
        metavar="N",
        help="minimum generation length, EOS excluded (default: 1)",
    )
    add("--match-source-len", action="store_true", help="generations end at the source length")
    add("--unnormalized", action="store_true", help="compare unnormalized hypothesis scores")
    add(
        "--no-early-stop",
        action="store_true",
        help="deprecated and ignored, as in fairseq (a sentence stops once it has --beam finished hypotheses)",
    )
    add(
        "--no-beamable-mm",
        action="store_true",
        help="accepted for fairseq compatibility; encoder keys/values are always shared across the beam",
    )
    add(
        "--lenpen",
        default=1.0,
        type=float,
        help="length penalty: scores are divided by length**lenpen; <1.0 favors shorter, >1.0 longer sentences",
    )
    add(
        "--unkpen",
        default=0.0,
        type=float,
        help="unknown word penalty: <0 produces more unks, >0 fewer (default: 0)",
    )
    add(
        "--prefix-size",
        default=0,
        type=int,
        metavar="PS",
        help="initialize generation by the first PS target tokens",
    )
    add(
        "--no-repeat-ngram-size",
        default=0,
        type=int,
        metavar="N",
        help="ngram blocking such that this size ngram cannot be repeated in the generation (0: off)",
    )
    add("--sampling", action="store_true", help="sample hypotheses instead of using beam search")
    add(
        "--sampling-topk",
        default=-1,
        type=int,
        metavar="PS",
        help="sample from the top k most likely words (-1: all)",
    )
    add(
        "--sampling-topp",
        default=-1.0,
        type=float,
        metavar="PS",
        help="sample from the smallest set of words whose cumulative probability mass exceeds p (-1: off)",
    )
    add(
        "--diverse-beam-groups",
        default=-1,
        type=int,
        metavar="N",
        help="number of groups for diverse beam search (Hamming diversity; -1: plain beam search)",
    )
    add(
        "--diverse-beam-strength",
        default=0.5,
        type=float,
        metavar="N",
        help="diverse beam search: how much a token proposed by an earlier group costs in a later one",
    )
    add(
        "--static-decoding",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode with fixed-shape steps (CUDA graphs on CUDA) and finish hypotheses on the device; the same "
        "hypotheses as the eager loop (default: on for CUDA, off on the CPU)",
    )
    add(
        "--packed-encoder",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the encoder pass on the sources' real tokens only (varlen attention), not padded; the same "
        "encoder output (default: on CUDA in fp16/bf16; on the CPU for batches of 20%% pads or more)",
    )
    add(
        "--temperature",
        default=1.0,
        type=float,
        metavar="N",
        help="temperature for generation (default: 1.0)",
    )
    return group


def flag_name(dest: str) -> str:
    """How the command line (and a --config file) names a generation setting: --max-len-b."""
    return "--" + dest.replace("_", "-")


def _kinds() -> dict[str, type]:
    """Each generation flag's kind (bool for switches, int, float), from add_generation_args itself."""
    parser = argparse.ArgumentParser(add_help=False)
    add_generation_args(parser)
    return {
        a.dest: bool if isinstance(a, argparse._StoreTrueAction) else a.type
        for a in parser._actions
        if a.type in (int, float) or isinstance(a, argparse._StoreTrueAction)
    }


KINDS = _kinds()


def check_generation_value(dest: str, value: Any, name: Callable[[str], str] = flag_name) -> None:
    """One generation setting: of its flag's kind (a switch takes True / False, an int flag an int, a float
    flag a number; never a string or a bool for a number) and in its range (seqtrain.flag_bounds), as
    SeqtrainError naming it by `name`."""
    kind = KINDS.get(dest)
    if kind is None:
        return
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        what = {bool: "True or False", int: "an integer", float: "a number"}[kind]
        raise SeqtrainError(f"{name(dest)} must be {what}, got {value!r}")
    try:
        check_value(dest, value)
    except argparse.ArgumentTypeError as e:
        raise SeqtrainError(f"{name(dest)} {e}") from None


def check_generation_args(args: argparse.Namespace, name: Callable[[str], str] = flag_name) -> None:
    """The one check of generation settings, wherever they come from: the command line and --config,
    --eval-rouge-args, a Hugging Face generation_config.json, seqtrain.Summarizer.summarize(**flags). Every
    setting's kind and range (check_generation_value), then fairseq's checks across them, as SeqtrainErrors
    naming each setting by `name` (the command line's --beam by default; a caller names its own source:
    `FOLDER/generation_config.json: num_beams`, `Summarizer.summarize(beam=...)`)."""
    for dest in KINDS:
        if hasattr(args, dest):
            check_generation_value(dest, getattr(args, dest), name)
    for dest in ("static_decoding", "packed_encoder"):  # switches with a default the device decides (None)
        if getattr(args, dest, None) not in (None, True, False):
            raise SeqtrainError(f"{name(dest)} must be True, False or None, got {getattr(args, dest)!r}")
    if args.beam < 1:
        raise SeqtrainError(f"{name('beam')} must be >= 1, got {args.beam}")
    if not 1 <= args.nbest <= args.beam:
        raise SeqtrainError(
            f"{name('nbest')} must be between 1 and {name('beam')} ({args.beam}), got {args.nbest}"
        )
    if args.min_len < 0:
        raise SeqtrainError(f"{name('min_len')} must be >= 0, got {args.min_len}")
    if args.max_len_b < 0 or args.max_len_a < 0:
        raise SeqtrainError(f"{name('max_len_a')} and {name('max_len_b')} must be >= 0")
    if args.min_len > 0 and args.max_len_a == 0 and args.min_len > args.max_len_b:
        raise SeqtrainError(
            f"{name('min_len')} {args.min_len} is above the maximum length {name('max_len_b')} {args.max_len_b}"
        )
    if args.prefix_size < 0:
        raise SeqtrainError(f"{name('prefix_size')} must be >= 0, got {args.prefix_size}")
    if args.no_repeat_ngram_size < 0:
        raise SeqtrainError(f"{name('no_repeat_ngram_size')} must be >= 0, got {args.no_repeat_ngram_size}")
    if args.temperature <= 0:
        raise SeqtrainError(f"{name('temperature')} must be > 0, got {args.temperature}")
    # --rerank picks --nbest of the beam's finished hypotheses, so sampling may keep fewer than --beam
    if args.sampling and args.nbest != args.beam and not getattr(args, "rerank", None):
        raise SeqtrainError(f"{name('sampling')} requires {name('nbest')} to be equal to {name('beam')}")
    if args.sampling_topp != -1.0 and not 0 < args.sampling_topp <= 1:
        raise SeqtrainError(f"{name('sampling_topp')} must be in (0, 1], got {args.sampling_topp}")
    groups = getattr(args, "diverse_beam_groups", -1)
    if groups > 0 and args.sampling:
        raise SeqtrainError(f"{name('diverse_beam_groups')} and {name('sampling')} cannot be used together")
    if groups > 0 and args.beam % groups:
        raise SeqtrainError(
            f"{name('beam')} {args.beam} must be a multiple of {name('diverse_beam_groups')} {groups}"
        )
    if (args.sampling_topk > 0 or args.sampling_topp > 0) and not args.sampling:
        raise SeqtrainError(f"{name('sampling_topk')}/{name('sampling_topp')} need {name('sampling')}")
