"""Generation flags, with fairseq's names and defaults (`fairseq-generate --beam 5 --lenpen 1 ...`)."""

from __future__ import annotations

import argparse

from seqtrain.errors import SeqtrainError


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
        "--temperature",
        default=1.0,
        type=float,
        metavar="N",
        help="temperature for generation (default: 1.0)",
    )
    return group


def check_generation_args(args: argparse.Namespace) -> None:
    """fairseq's sanity checks on the generation flags, as SeqtrainErrors naming the flag."""
    if args.beam < 1:
        raise SeqtrainError(f"--beam must be >= 1, got {args.beam}")
    if not 1 <= args.nbest <= args.beam:
        raise SeqtrainError(f"--nbest must be between 1 and --beam ({args.beam}), got {args.nbest}")
    if args.min_len < 0:
        raise SeqtrainError(f"--min-len must be >= 0, got {args.min_len}")
    if args.max_len_b < 0 or args.max_len_a < 0:
        raise SeqtrainError("--max-len-a and --max-len-b must be >= 0")
    if args.prefix_size < 0:
        raise SeqtrainError(f"--prefix-size must be >= 0, got {args.prefix_size}")
    if args.no_repeat_ngram_size < 0:
        raise SeqtrainError(f"--no-repeat-ngram-size must be >= 0, got {args.no_repeat_ngram_size}")
    if args.temperature <= 0:
        raise SeqtrainError(f"--temperature must be > 0, got {args.temperature}")
    if args.sampling and args.nbest != args.beam:
        raise SeqtrainError("--sampling requires --nbest to be equal to --beam")
    if args.sampling_topp != -1.0 and not 0 < args.sampling_topp <= 1:
        raise SeqtrainError(f"--sampling-topp must be in (0, 1], got {args.sampling_topp}")
    if (args.sampling_topk > 0 or args.sampling_topp > 0) and not args.sampling:
        raise SeqtrainError("--sampling-topk/--sampling-topp need --sampling")
