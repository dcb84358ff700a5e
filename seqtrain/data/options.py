"""Dataset and batching flags, with fairseq's names and defaults.

--max-source-positions / --max-target-positions belong to the model and --seed to the common flags; they are
defined elsewhere.
"""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_INT


@settings
class ValidationConfig:
    """Validation: which splits the training loop trains and validates on, and when it validates (in
    seqtrain-train's dataset group)"""

    train_subset: str = setting("train", "split to train on", metavar="SPLIT")
    valid_subset: str = setting("valid", "comma-separated splits to validate on", metavar="SPLITS")
    validate_interval: int = setting(1, "validate every N epochs", type=int, metavar="N", bounds=POSITIVE_INT)
    validate_interval_updates: int = setting(0, "also validate every N updates", type=int, metavar="N")
    validate_after_updates: int = setting(0, "no validation before N updates", type=int, metavar="N")
    disable_validation: bool = setting(False, "never validate", action="store_true")
    max_valid_steps: int | None = setting(
        None, "validate on at most N batches", type=int, metavar="N", bounds=POSITIVE_INT
    )


def str2bool(value: Any) -> bool:
    """A boolean flag value: true/false, yes/no, on/off, 1/0 (any case); bools pass through (config files)."""
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("true", "1", "yes", "y", "on"):
        return True
    if low in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def _bool_flag(group: argparse._ArgumentGroup, name: str, default: bool, help: str) -> None:
    # fairseq <= 0.10 took `--left-pad-source False`; fairseq 0.12 made the bare flag flip the default.
    # Accept both spellings: a value sets it, the bare flag flips it.
    group.add_argument(
        name, type=str2bool, nargs="?", const=not default, default=default, metavar="BOOL", help=help
    )


def add_dataset_args(
    parser: argparse.ArgumentParser, train: bool = True, gen: bool = False
) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("dataset and batching")
    group.add_argument(
        "-s",
        "--source-lang",
        default=None,
        metavar="SRC",
        help="source suffix of the data-bin files (default: inferred from them; "
        "seqtrain-preprocess writes 'source')",
    )
    group.add_argument(
        "-t",
        "--target-lang",
        default=None,
        metavar="TGT",
        help="target suffix of the data-bin files (default: inferred; seqtrain-preprocess writes 'target')",
    )
    group.add_argument(
        "--max-tokens",
        type=max_tokens_value if train else int,
        default=None,
        metavar="N",
        help="max tokens per batch, padding included: batch size x longest example"
        + (
            "; auto: the largest that fits in CUDA memory, probed before training with the longest batch "
            "(kept in the checkpoints: a resume uses the same)"
            if train
            else ""
        ),
    )
    group.add_argument(
        "--batch-size",
        "--max-sentences",
        type=int,
        default=None,
        metavar="N",
        dest="batch_size",
        help="max sentences per batch",
    )
    group.add_argument(
        "--required-batch-size-multiple",
        type=int,
        default=8,
        metavar="N",
        help="make batch sizes a multiple of N where --max-tokens allows it",
    )
    group.add_argument(
        "--num-workers",
        type=int,
        default=1,
        metavar="N",
        help="DataLoader worker processes that read and pad batches while the device trains, kept across "
        "epochs (fairseq's default, 1; 0: in the main process)",
    )
    group.add_argument(
        "--skip-invalid-size-inputs-valid-test",
        action="store_true",
        help="drop examples longer than the max positions (with a warning) instead of failing",
    )
    group.add_argument(
        "--truncate-source",
        action="store_true",
        help="cut sources longer than --max-source-positions to fit (keeping the final </s>)",
    )
    _bool_flag(group, "--left-pad-source", True, "pad the source on the left (default: True)")
    _bool_flag(group, "--left-pad-target", False, "pad the target on the left (default: False)")
    group.add_argument(
        "--prepend-bos",
        action="store_true",
        help="put <s> before source and target (the Hugging Face BART convention)",
    )
    if train:
        group.add_argument("--train-subset", default="train", metavar="SPLIT", help="data split to train on")
        group.add_argument(
            "--valid-subset",
            default="valid",
            metavar="SPLITS",
            help="comma-separated data splits to validate on",
        )
        group.add_argument(
            "--max-tokens-valid",
            type=int,
            default=None,
            metavar="N",
            help="--max-tokens for validation (default: --max-tokens)",
        )
        group.add_argument(
            "--batch-size-valid",
            "--max-sentences-valid",
            type=int,
            default=None,
            metavar="N",
            dest="batch_size_valid",
            help="--batch-size for validation (default: --batch-size)",
        )
    if gen:
        group.add_argument(
            "--gen-subset", default="test", metavar="SPLIT", help="data split to generate from"
        )
    return group


def max_tokens_value(value: Any) -> int | str:
    """seqtrain-train's --max-tokens: a number, or "auto" (seqtrain.train.auto_tokens)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return int(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number of tokens or auto, got {value!r}") from None


def check_dataset_args(args: argparse.Namespace) -> argparse.Namespace:
    """Validate the batching flags and fill the validation defaults from the training ones (as fairseq)."""
    if getattr(args, "max_tokens", None) is None and getattr(args, "batch_size", None) is None:
        raise SeqtrainError("give the batch size with --max-tokens or --batch-size")
    for flag in ("max_tokens", "batch_size", "max_tokens_valid", "batch_size_valid"):
        value = getattr(args, flag, None)
        if value is not None and value != "auto" and value <= 0:
            raise SeqtrainError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    if getattr(args, "required_batch_size_multiple", 1) < 1:
        raise SeqtrainError("--required-batch-size-multiple must be at least 1")
    if getattr(args, "num_workers", 0) < 0:
        raise SeqtrainError("--num-workers must be 0 or more")
    if hasattr(args, "max_tokens_valid") and args.max_tokens_valid is None:
        args.max_tokens_valid = args.max_tokens
    if hasattr(args, "batch_size_valid") and args.batch_size_valid is None:
        args.batch_size_valid = args.batch_size
    return args
