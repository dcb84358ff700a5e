"""What a checkpoint (seqtrain, fairseq or Hugging Face) claims, checked against what it holds before any model
is built: the weights are tensors under string names, and the model dimensions in its args are integers in
sane bounds that agree with the stored tensors' shapes. A crafted file claiming a dimension of 1e6 is refused
here instead of making the model builder allocate terabytes."""

from __future__ import annotations

import argparse
import re
from typing import Any

import torch

from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import BOUNDS, bounds_for, check_value, describe

DIM_ARGS = tuple(
    f"{side}_{name}"
    for side in ("encoder", "decoder")
    for name in ("embed_dim", "ffn_embed_dim", "layers", "attention_heads")
) + ("max_source_positions", "max_target_positions")

# arg -> (a weight holding it, the axis of that weight)
_SHAPES = {
    "encoder_embed_dim": ("encoder.embed_tokens.weight", 1),
    "decoder_embed_dim": ("decoder.embed_tokens.weight", 1),
    "encoder_ffn_embed_dim": ("encoder.layers.0.fc1.weight", 0),
    "decoder_ffn_embed_dim": ("decoder.layers.0.fc1.weight", 0),
}


def check_weights(model: Any, where: str) -> None:
    if not isinstance(model, dict):
        raise SeqtrainError(f"{where}: the weights are a {type(model).__name__}, not a dict of tensors")
    for k, v in model.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise SeqtrainError(f"{where}: weight {k!r} is a {type(v).__name__}, not a tensor")


def check_model_args(args: Any, model: dict[str, torch.Tensor], where: str) -> None:
    """Every model dimension in `args` is an int in bounds and agrees with the stored weights."""
    values = vars(args)
    for name in DIM_ARGS:
        v = values.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise SeqtrainError(f"{where}: model arg {name}={v!r} is not an integer")
        b = bounds_for(name, int)
        if not b.lo <= v <= b.hi:
            raise SeqtrainError(f"{where}: model arg {name}={v} is out of bounds (must be {describe(b)})")
    for name, (key, axis) in _SHAPES.items():
        v, w = values.get(name), model.get(key)
        if v is not None and w is not None and (w.dim() <= axis or w.shape[axis] != v):
            raise SeqtrainError(
                f"{where}: model arg {name}={v} does not match the stored {key} of shape {tuple(w.shape)}"
            )
    for side in ("encoder", "decoder"):
        layers = {int(m.group(1)) for k in model if (m := re.match(rf"{side}\.layers\.(\d+)\.", k))}
        n = values.get(f"{side}_layers")
        if n is not None and layers and len(layers) != n:
            raise SeqtrainError(
                f"{where}: model arg {side}_layers={n} but the weights hold {len(layers)} {side} layers"
            )
        dim, heads = values.get(f"{side}_embed_dim"), values.get(f"{side}_attention_heads")
        if dim is not None and heads is not None and dim % heads:
            raise SeqtrainError(
                f"{where}: model arg {side}_embed_dim={dim} is not divisible by {side}_attention_heads={heads}"
            )


def check_arch_overrides(args: Any, overrides: Any, where: str = "--model-overrides") -> None:
    """Overrides of a checkpoint's model args (generate's --model-overrides, Summarizer's model_overrides),
    checked before they replace anything: a JSON object whose values have the kind of the args they replace
    (an int for an int, a number for a float, true / false for a switch, a string for a string) and lie in the
    flag's range (seqtrain.flag_bounds) where the arg is a flag. Before (issue 31),
    '{"encoder_embed_dim": "x"}' went into the model builder and ended in a TypeError traceback."""
    if not isinstance(overrides, dict):
        raise SeqtrainError(f"{where}: give a JSON object, e.g. '{{\"dropout\": 0.0}}'")
    values = vars(args)
    for key, value in overrides.items():
        have = values.get(key)
        if have is not None:
            if isinstance(have, bool):
                ok = isinstance(value, bool)
            elif isinstance(have, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(have, float):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                ok = isinstance(value, type(have))
            if not ok:
                raise SeqtrainError(
                    f"{where}: {key}={value!r} does not fit the checkpoint's {key}={have!r} (another kind of value)"
                )
        if key in BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                check_value(key, value)
            except argparse.ArgumentTypeError as e:
                raise SeqtrainError(f"{where}: {key}={value!r}: {e}") from None


def check_contents(ck: Any) -> None:
    """check_weights + check_model_args for a seqtrain.checkpoint.files.CheckpointContents; also its tokenizer."""
    check_weights(ck.model, ck.path)
    check_model_args(ck.args, ck.model, ck.path)
    if ck.tokenizer is not None and not isinstance(ck.tokenizer, dict):
        raise SeqtrainError(f"{ck.path}: the tokenizer entry is a {type(ck.tokenizer).__name__}, not a spec")
