"""Range checks for every numeric flag of every CLI, applied at parse time (command line and --config alike).

seqtrain's ArgumentParser runs `check_value` on each value an int or float flag produces (also on each element of
list-valued flags such as --lr and --update-freq): floats must be finite, and every value must lie in the flag's
range. `BOUNDS` names the flags whose range differs from the default one (ints: 0 to 2^31 - 1; floats: 0 to 1e9);
`OFF` is the sentinel some flags take for "off / unlimited" (fairseq's -1), accepted besides the range.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, NamedTuple

INT_MAX = 2**31 - 1
FLOAT_MAX = 1e9


class Bounds(NamedTuple):
    lo: float
    hi: float
    lo_open: bool = False  # lo itself is excluded (a value must be > lo)
    off: float | None = None  # a sentinel accepted outside the range (fairseq's -1: off / unlimited)


POSITIVE_INT = Bounds(1, INT_MAX)
PROBABILITY = Bounds(0, 1)
POSITIVE_FLOAT = Bounds(0, FLOAT_MAX, lo_open=True)
OFF_OR_COUNT = Bounds(0, INT_MAX, off=-1)

BOUNDS: dict[str, Bounds] = {
    # common, logging, distributed
    "seed": Bounds(0, 2**32 - 1),
    "log_interval": POSITIVE_INT,
    "peak_flops": Bounds(0, 1e21, lo_open=True),
    "distributed_world_size": Bounds(1, 65536),
    "distributed_rank": Bounds(0, 65535),
    "device_id": Bounds(0, 65535),
    "distributed_port": Bounds(1, 65535, off=-1),
    "distributed_timeout": Bounds(0, 1e7, lo_open=True),
    "bucket_cap_mb": Bounds(1, 65536),
    "num_workers": Bounds(0, 1024),
    # fp16 loss scaling
    "fp16_init_scale": Bounds(1, 2**24),
    "fp16_scale_window": POSITIVE_INT,
    "fp16_scale_tolerance": PROBABILITY,
    "min_loss_scale": POSITIVE_FLOAT,
    "threshold_loss_scale": POSITIVE_FLOAT,
    # dataset and batching
    "max_tokens": POSITIVE_INT,
    "batch_size": POSITIVE_INT,
    "max_tokens_valid": POSITIVE_INT,
    "batch_size_valid": POSITIVE_INT,
    "required_batch_size_multiple": POSITIVE_INT,
    "max_valid_steps": POSITIVE_INT,
    "validate_interval": POSITIVE_INT,
    "save_interval": POSITIVE_INT,
    "update_freq": POSITIVE_INT,
    "lora_dropout": PROBABILITY,
    "lora_alpha": POSITIVE_FLOAT,
    "lora_rank": Bounds(0, 65536),  # 0: off; at most the widest --*-embed-dim (apply_lora: the model's own)
    "total_num_update": POSITIVE_INT,
    "force_anneal": POSITIVE_INT,
    "keep_best_checkpoints": OFF_OR_COUNT,
    "keep_interval_updates": OFF_OR_COUNT,
    "keep_last_epochs": OFF_OR_COUNT,
    "patience": OFF_OR_COUNT,
    # model
    "encoder_layers": Bounds(1, 1024),
    "decoder_layers": Bounds(1, 1024),
    "encoder_attention_heads": Bounds(1, 1024),
    "decoder_attention_heads": Bounds(1, 1024),
    "encoder_embed_dim": Bounds(1, 65536),
    "decoder_embed_dim": Bounds(1, 65536),
    "encoder_ffn_embed_dim": Bounds(1, 262144),
    "decoder_ffn_embed_dim": Bounds(1, 262144),
    "max_source_positions": Bounds(1, 1 << 20),
    "max_target_positions": Bounds(1, 1 << 20),
    "dropout": PROBABILITY,
    "attention_dropout": PROBABILITY,
    "activation_dropout": PROBABILITY,
    "relu_dropout": PROBABILITY,
    "label_smoothing": PROBABILITY,
    "loss_chunk_mb": Bounds(0, 1 << 20, lo_open=True),
    "distill_temperature": Bounds(0, 1000, lo_open=True),
    "distill_alpha": PROBABILITY,
    # optimizers and schedulers
    "lr": Bounds(0, 1000),  # 0: weights stay as loaded (checks of loading and resuming)
    "max_lr": Bounds(0, 1000, lo_open=True),
    "end_learning_rate": Bounds(0, 1000),
    "min_lr": Bounds(0, 1000),
    "warmup_init_lr": Bounds(0, 1000, off=-1),
    "stop_min_lr": Bounds(0, 1000, off=-1),
    "adam_eps": Bounds(0, 1, lo_open=True),
    "weight_decay": Bounds(0, 1000),
    "momentum": PROBABILITY,
    "beta1": PROBABILITY,
    "decay_rate": Bounds(-1, 0),
    "clip_threshold": POSITIVE_FLOAT,
    "lr_shrink": Bounds(0, 1, lo_open=True),
    "lr_period_updates": Bounds(0, FLOAT_MAX, lo_open=True, off=-1),
    "t_mult": POSITIVE_FLOAT,
    "power": POSITIVE_FLOAT,
    # the denoising task (BART pretraining)
    "tokens_per_sample": Bounds(3, 1 << 20),  # <s>, one token, </s>
    "mask": PROBABILITY,
    "mask_random": PROBABILITY,
    "insert": PROBABILITY,
    "permute": PROBABILITY,
    "rotate": PROBABILITY,
    # fairseq's span distribution keeps P(k) up to the first below 1e-7: above -ln(1e-7) = 16.1 that is P(0)
    # alone (every span empty), and from ~100 P(0) underflows to 0 (torch: invalid multinomial distribution)
    "poisson_lambda": Bounds(0, 16, lo_open=True),
    "permute_sentences": Bounds(0, 1, off=-1),
    "replace_length": Bounds(-1, 1),
    "shuffle_instance": PROBABILITY,
}


def bounds_for(dest: str, kind: type) -> Bounds:
    return BOUNDS.get(dest, Bounds(0, INT_MAX if kind is int else FLOAT_MAX))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def describe(b: Bounds) -> str:
    if b.lo_open:
        text = f"above {_fmt(b.lo)} and at most {_fmt(b.hi)}"
    else:
        text = f"between {_fmt(b.lo)} and {_fmt(b.hi)}"
    return f"{_fmt(b.off)} (off) or {text}" if b.off is not None else text


def check_value(dest: str, value: Any) -> Any:
    """Return `value` (a number or a list of numbers) if every number in it is finite and in `dest`'s range;
    raise argparse.ArgumentTypeError otherwise. Other values pass unchanged."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {v}")
        b = bounds_for(dest, type(v))
        if b.off is not None and v == b.off:
            continue
        if v < b.lo or v > b.hi or (b.lo_open and v == b.lo):
            raise argparse.ArgumentTypeError(f"must be {describe(b)}, got {_fmt(v) if abs(v) < 1e16 else v}")
    return value
