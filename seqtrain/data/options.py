"""Dataset and batching flags, with fairseq's names and defaults.

--max-source-positions / --max-target-positions belong to the model and --seed to the common flags; they are
defined elsewhere.
"""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.config import add_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_INT, Bounds


@settings
class ValidationConfig:
    """Validation: when the training loop validates, and on how much (in seqtrain-train's dataset group, after
    TrainDatasetConfig's splits)"""

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


def max_tokens_value(value: Any) -> int | str:
    """seqtrain-train's --max-tokens: a number, or "auto" (seqtrain.train.auto_tokens)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return int(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number of tokens or auto, got {value!r}") from None


def _pad_flag(default: bool, help: str) -> Any:  # noqa: A002 (argparse's name)
    # fairseq <= 0.10 took `--left-pad-source False`; fairseq 0.12 made the bare flag flip the default.
    # Accept both spellings: a value sets it, the bare flag flips it.
    return setting(default, help, type=str2bool, nargs="?", const=not default, metavar="BOOL")


_MAX_TOKENS_HELP = "max tokens per batch, padding included: batch size x longest example"


@settings
class DatasetConfig:
    """dataset and batching: how a data-bin split is read and batched (every program that reads one)"""

    source_lang: str | None = setting(
        None,
        "source suffix of the data-bin files (default: inferred from them; seqtrain-preprocess writes 'source')",
        flags=("-s", "--source-lang"),
        metavar="SRC",
    )
    target_lang: str | None = setting(
        None,
        "target suffix of the data-bin files (default: inferred; seqtrain-preprocess writes 'target')",
        flags=("-t", "--target-lang"),
        metavar="TGT",
    )
    max_tokens: int | None = setting(None, _MAX_TOKENS_HELP, type=int, metavar="N", bounds=POSITIVE_INT)
    batch_size: int | None = setting(
        None,
        "max sentences per batch",
        flags=("--batch-size", "--max-sentences"),
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    required_batch_size_multiple: int = setting(
        8,
        "make batch sizes a multiple of N where --max-tokens allows it",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    num_workers: int = setting(
        1,
        "DataLoader worker processes that read and pad batches while the device trains, kept across "
        "epochs (fairseq's default, 1; 0: in the main process)",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1024),
        not_in=("generate", "interactive", "tune"),
    )
    skip_invalid_size_inputs_valid_test: bool = setting(
        False,
        "drop examples longer than the max positions (with a warning) instead of failing",
        action="store_true",
    )
    truncate_source: bool = setting(
        False,
        "cut sources longer than --max-source-positions to fit (keeping the final </s>)",
        action="store_true",
    )
    left_pad_source: bool = _pad_flag(True, "pad the source on the left (default: True)")
    left_pad_target: bool = _pad_flag(False, "pad the target on the left (default: False)")
    prepend_bos: bool = setting(
        False, "put <s> before source and target (the Hugging Face BART convention)", action="store_true"
    )


@settings
class TrainDatasetConfig(DatasetConfig):
    """dataset and batching: seqtrain-train's (--max-tokens auto; the training and validation splits)"""

    max_tokens: int | str | None = setting(
        None,
        _MAX_TOKENS_HELP
        + "; auto: the largest that fits in CUDA memory, probed before training with the longest "
        "batch (kept in the checkpoints: a resume uses the same)",
        type=max_tokens_value,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    train_subset: str = setting("train", "data split to train on", metavar="SPLIT")
    valid_subset: str = setting("valid", "comma-separated data splits to validate on", metavar="SPLITS")
    max_tokens_valid: int | None = setting(
        None,
        "--max-tokens for validation (default: --max-tokens)",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    batch_size_valid: int | None = setting(
        None,
        "--batch-size for validation (default: --batch-size)",
        flags=("--batch-size-valid", "--max-sentences-valid"),
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )


@settings
class GenDatasetConfig(DatasetConfig):
    """dataset and batching: seqtrain-generate's (the split to generate from)"""

    gen_subset: str = setting("test", "data split to generate from", metavar="SPLIT", not_in=("interactive",))


def add_dataset_args(
    parser: argparse.ArgumentParser, train: bool = True, gen: bool = False, program: str | None = None
) -> argparse._ArgumentGroup:
    """The dataset and batching flags (`program`: leave out the fields marked not_in it)."""
    cls = TrainDatasetConfig if train else DatasetConfig
    group = add_settings(parser, cls, "dataset and batching", program=program)
    if gen:
        add_settings(parser, GenDatasetConfig, group=group, program=program)
    return group


def check_dataset_args(cfg: DatasetConfig) -> DatasetConfig:
    """Validate the batching settings and fill the validation defaults from the training ones (as fairseq)."""
    if cfg.max_tokens is None and cfg.batch_size is None:
        raise SeqtrainError("give the batch size with --max-tokens or --batch-size")
    train = isinstance(cfg, TrainDatasetConfig)
    valid = ("max_tokens_valid", "batch_size_valid") if train else ()
    for flag in ("max_tokens", "batch_size", *valid):
        value = getattr(cfg, flag)
        if value is not None and value != "auto" and value <= 0:
            raise SeqtrainError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    if cfg.required_batch_size_multiple < 1:
        raise SeqtrainError("--required-batch-size-multiple must be at least 1")
    if cfg.num_workers < 0:
        raise SeqtrainError("--num-workers must be 0 or more")
    if train:
        if cfg.max_tokens_valid is None:
            cfg.max_tokens_valid = cfg.max_tokens
        if cfg.batch_size_valid is None:
            cfg.batch_size_valid = cfg.batch_size
    return cfg
