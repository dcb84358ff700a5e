"""What a checkpoint (seqtrain, fairseq or Hugging Face) claims, checked against what it holds before any model
is built: the weights are tensors under string names, and the model dimensions in its args are integers in
sane bounds that agree with the stored tensors' shapes. A crafted file claiming a dimension of 1e6 is refused
here instead of making the model builder allocate terabytes.

Every other field a reader uses is checked the same way, for kind and range, before anything is allocated
(issue 40): the model args the builder reads (`ARG_KINDS`: dropouts, switches, the activation, LoRA's rank,
scaling and modules, mBART's langs), the adapters the weights hold (each on a projection --lora-modules names,
of the stored rank), the learned positions' rows, and the training state a resume or an --ema export reads
(`check_training_state`: the EMA, its counter, --max-tokens auto's choice, the update and epoch counts)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

import torch

from seqtrain.checkpoint.train_state import EXTRA_STATE, SCALAR_KINDS, TrainState
from seqtrain.data.dictionary import parse_langs
from seqtrain.distributed import LaunchConfig  # noqa: F401 (registers its fields' ranges, read below)
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import BOUNDS, bounds_for, check_value, describe
from seqtrain.models.lora import LORA_TARGETS, is_lora_key

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


# The other model args a reader uses (the model builder's BartConfig fields, LoRA's, the task's langs, resume's
# world size), by the kind each must have; numbers must also lie in their flag's range (seqtrain.flag_bounds: the
# ranges that settings classes declare are registered when their module is imported, hence LaunchConfig's import).
ARG_KINDS: dict[str, type] = {
    **dict.fromkeys(("dropout", "attention_dropout", "activation_dropout", "relu_dropout"), float),
    **dict.fromkeys(("lora_alpha", "lora_dropout"), float),
    "lora_rank": int,
    "distributed_world_size": int,  # its range: LaunchConfig's field
    **dict.fromkeys(
        (
            "share_all_embeddings",
            "no_scale_embedding",
            "encoder_normalize_before",
            "decoder_normalize_before",
            "checkpoint_activations",
        ),
        bool,
    ),
    **dict.fromkeys(("activation_fn", "weight_init", "lora_modules", "langs", "arch"), str),
}
POSITION_OFFSET = 2  # fairseq's learned positions: padding index + 1 rows before position 0


def _check_kind(name: str, v: Any, kind: type, where: str) -> None:
    if kind is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
        what = "an integer"
    elif kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        what = "a finite number"
    else:
        ok, what = isinstance(v, kind), {bool: "true or false", str: "a string"}[kind]
    if not ok:
        raise SeqtrainError(f"{where}: model arg {name}={v!r} is not {what}")
    if name in BOUNDS and kind in (int, float):
        try:
            check_value(name, v)
        except argparse.ArgumentTypeError as e:
            raise SeqtrainError(f"{where}: model arg {name}={v!r} is out of bounds ({e})") from None


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
    for name, kind in ARG_KINDS.items():
        if values.get(name) is not None:
            _check_kind(name, values[name], kind, where)
    if values.get("langs"):
        parse_langs(values["langs"], f"{where}: model arg langs")
    check_lora_args(values, model, where)


def check_lora_args(values: dict[str, Any], model: dict[str, torch.Tensor], where: str) -> None:
    """LoRA's rank, within the model's widths (a rank above the smallest width adapts nothing more and only
    allocates), its modules, and the stored adapters: each on a projection of the weights that --lora-modules
    names, of the stored rank (A: rank x in, B: out x rank)."""
    rank = values.get("lora_rank") or 0
    widths = [values.get(f"{s}_embed_dim") for s in ("encoder", "decoder")]
    widest_rank = min((w for w in widths if isinstance(w, int)), default=None)
    if rank and widest_rank is not None and rank > widest_rank:
        raise SeqtrainError(
            f"{where}: model arg lora_rank={rank} is above the model's width {widest_rank} (at most {widest_rank})"
        )
    modules = values.get("lora_modules")
    targets = tuple(x.strip() for x in (modules or "q_proj,v_proj").split(",") if x.strip())
    if not targets or any(t not in LORA_TARGETS for t in targets):
        raise SeqtrainError(
            f"{where}: model arg lora_modules={modules!r}: choose from {','.join(LORA_TARGETS)}"
        )
    for key, t in model.items():
        if not is_lora_key(key):
            continue
        owner, part = key.rsplit(".", 1)
        base = model.get(f"{owner}.weight")
        if not rank:
            raise SeqtrainError(
                f"{where}: weight {key!r} is a LoRA adapter, but model arg lora_rank={rank!r}"
            )
        if base is None or base.dim() != 2 or owner.rsplit(".", 1)[-1] not in targets:
            raise SeqtrainError(
                f"{where}: weight {key!r} adapts {owner}, which is no projection the model's lora_modules "
                f"({','.join(targets)}) names"
            )
        want = (rank, base.shape[1]) if part == "lora_A" else (base.shape[0], rank)
        if tuple(t.shape) != want:
            raise SeqtrainError(
                f"{where}: weight {key!r} has shape {tuple(t.shape)}; lora_rank={rank} over {owner} of shape "
                f"{tuple(base.shape)} needs {want}"
            )


def check_positions(args: Any, model: dict[str, torch.Tensor], where: str) -> None:
    """The learned positions stored agree with the file's own max_source/target_positions (its rows are the
    positions + fairseq's 2 offset rows). Only the file is checked so: --model-overrides may ask for more or
    fewer positions, which loading fits (seqtrain.models.resize.fit_positions)."""
    values = vars(args)
    for side, name in (("encoder", "max_source_positions"), ("decoder", "max_target_positions")):
        n, w = values.get(name), model.get(f"{side}.embed_positions.weight")
        if isinstance(n, int) and w is not None and (w.dim() != 2 or w.shape[0] != n + POSITION_OFFSET):
            raise SeqtrainError(
                f"{where}: model arg {name}={n} does not match the stored {side}.embed_positions.weight of shape "
                f"{tuple(w.shape)} ({n + POSITION_OFFSET} rows: the positions and 2 offset rows)"
            )


def check_training_state(state: Any, model: dict[str, torch.Tensor], where: str) -> None:
    """A seqtrain checkpoint's extra_state, as a resume (and seqtrain-convert --ema) reads it: its scalars of
    their kind and in range, and an EMA that is tensors of the stored weights' names and shapes."""
    extra = state.get(EXTRA_STATE) if isinstance(state, dict) else None
    if extra is None:
        return
    if not isinstance(extra, dict):
        raise SeqtrainError(f"{where}: extra_state is a {type(extra).__name__}, not a dict")
    record = TrainState.from_dict(state)
    for name, (kind, lo) in SCALAR_KINDS.items():
        v = getattr(record, name)
        if v is None:
            continue
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        ok = (isinstance(v, int) if kind is int else number and math.isfinite(v)) and number
        if not ok or v < lo or (name == "auto_max_tokens" and v > bounds_for("max_tokens", int).hi):
            raise SeqtrainError(
                f"{where}: extra_state[{name!r}]={v!r} is not {'an integer' if kind is int else 'a number'} "
                f">= {lo}"
                + (f" and <= {bounds_for('max_tokens', int).hi}" if name == "auto_max_tokens" else "")
            )
    for key in ("ema", "ema_fp32_params"):
        ema = getattr(record, key)
        if ema is None:
            continue
        if not isinstance(ema, dict):
            raise SeqtrainError(
                f"{where}: extra_state[{key!r}] is a {type(ema).__name__}, not a dict of tensors"
            )
        for k, v in ema.items():
            w = model.get(k) if isinstance(k, str) else None
            if not isinstance(v, torch.Tensor) or w is None or v.shape != w.shape:
                shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise SeqtrainError(
                    f"{where}: extra_state[{key!r}] entry {k!r} ({shape}) is not a tensor of a stored weight's "
                    "name and shape"
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
    """check_weights, check_model_args, check_positions and check_training_state for a
    seqtrain.checkpoint.files.CheckpointContents; also its tokenizer."""
    check_weights(ck.model, ck.path)
    check_model_args(ck.args, ck.model, ck.path)
    check_positions(ck.args, ck.model, ck.path)
    if ck.format == "seqtrain":  # fairseq's extra_state is read by no seqtrain reader but the data position
        check_training_state(ck.state, ck.model, ck.path)
    if ck.tokenizer is not None and not isinstance(ck.tokenizer, dict):
        raise SeqtrainError(f"{ck.path}: the tokenizer entry is a {type(ck.tokenizer).__name__}, not a spec")
