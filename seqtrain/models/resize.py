"""Fitting checkpoint weights to a model: vocabulary rows to the dictionaries, learned positions to
--max-source/target-positions (cut, or extended by copying), the layers --encoder/--decoder-layers-to-keep
choose, and one clear error when the weights do not fit the architecture."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from seqtrain.errors import SeqtrainError
from seqtrain.models.lora import is_lora_key

logger = logging.getLogger(__name__)

# The three token embeddings of a BART model (tied when --share-all-embeddings)
EMBEDDING_KEYS = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.output_projection.weight",
)


# fairseq pads a dictionary to a multiple of --padding-factor (8) with madeupword rows: that many rows, less one,
# are the most a model's embedding and its own dictionary can differ by. Released files that differ by more:
RELEASED_LAYOUTS = {(51201, 50264): "fairseq's released bart.base (its embedding padded to 51,201 rows)"}
PADDING_FACTOR = 8


def check_resize(old: int, new: int, name: str, where: str) -> None:
    """Refuse fitting `old` embedding rows to a dictionary of `new` symbols when fairseq's padding cannot
    explain the difference (nor a released layout): the dictionary then belongs to another model, and every
    token id would meet another token's embedding."""
    if abs(old - new) < PADDING_FACTOR or (old, new) in RELEASED_LAYOUTS:
        return
    how = f"cut {old - new} rows" if new < old else f"add {new - old} new rows"
    raise SeqtrainError(
        f"{where}: {name} has {old:,} rows but the dictionary has {new:,} symbols: fitting it would {how}, more "
        f"than fairseq's dictionary padding explains (at most {PADDING_FACTOR - 1}); the dictionary probably "
        "belongs to another model: give the model's own dictionary, or pass --resize-vocab to resize anyway"
    )


def resize_embeddings(
    state: dict[str, torch.Tensor],
    src_size: int,
    tgt_size: int,
    padding_idx: int = 1,
    init: str = "mean",
    where: str = "checkpoint",
    seed: int = 0,
    allow_any: bool = False,
) -> dict[str, torch.Tensor]:
    """Make the embedding rows match the dictionaries: extra rows (bart.base's padded 51201 rows, bart.large's
    <mask>) are cut; missing rows are appended, initialized to the mean of the existing rows (init="mean", so
    new tokens start with average logits) or normal(0, 0.02) (init="normal"); a new padding row is zero. Tied
    tensors stay tied. Logs one line when anything changed. A change beyond fairseq's padding (check_resize)
    is refused unless `allow_any` (--resize-vocab)."""
    if init not in ("mean", "normal"):
        raise ValueError(f"init must be 'mean' or 'normal', got {init!r}")
    wanted = {
        "encoder.embed_tokens.weight": src_size,
        "decoder.embed_tokens.weight": tgt_size,
        "decoder.output_projection.weight": tgt_size,
    }
    out = dict(state)
    done: dict[tuple[int, tuple[int, ...], int], torch.Tensor] = {}
    changes: list[tuple[str, int, int]] = []
    gen = torch.Generator().manual_seed(seed)
    new_rows_cache: dict[tuple[int, int], torch.Tensor] = {}
    for key, size in wanted.items():
        t = state.get(key)
        if t is None or t.shape[0] == size:
            continue
        if not allow_any:
            check_resize(t.shape[0], size, key, where)
        ident = (t.data_ptr(), tuple(t.shape), size)
        if ident not in done:
            old = t.shape[0]
            if size < old:
                new = t[:size].clone()
            else:
                if init == "mean":
                    keep = torch.ones(old, dtype=torch.bool)
                    if padding_idx < old:
                        keep[padding_idx] = False
                    extra = t[keep].float().mean(0, keepdim=True).expand(size - old, -1).to(t.dtype)
                else:
                    cache_key = (size - old, t.shape[1])
                    if cache_key not in new_rows_cache:
                        new_rows_cache[cache_key] = torch.randn(size - old, t.shape[1], generator=gen) * 0.02
                    extra = new_rows_cache[cache_key].to(t.dtype)
                new = torch.cat([t, extra], 0)
                if old <= padding_idx < size:
                    new[padding_idx].zero_()
            done[ident] = new
        out[key] = done[ident]
        changes.append((key.rsplit(".", 1)[0], t.shape[0], size))
    if changes:
        parts = []
        for name, old, new in changes:
            how = f"truncated {old - new} rows" if new < old else f"added {new - old} rows ({init} init)"
            parts.append(f"{name} {old}->{new} ({how})")
        logger.info(f"{where}: resized vocabulary embeddings to the dictionary: {'; '.join(parts)}")
    return out


POSITION_KEYS = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")
POSITION_OFFSET = 2  # fairseq's learned positions start after padding index + 1 rows


def extend_positions(table: torch.Tensor, rows: int) -> torch.Tensor:
    """A learned position table (fairseq's two offset rows first) grown to `rows` rows by copying the trained rows
    after themselves: position p computes as position p mod n did."""
    trained = table[POSITION_OFFSET:]
    reps = -(-(rows - POSITION_OFFSET) // trained.shape[0])
    tiled = trained.repeat(reps, *([1] * (trained.dim() - 1)))[: rows - POSITION_OFFSET]
    return torch.cat([table[:POSITION_OFFSET], tiled], 0)


def fit_positions(
    state: dict[str, torch.Tensor], model: torch.nn.Module, where: str
) -> dict[str, torch.Tensor]:
    """Fit the learned position rows to the model's --max-source/target-positions. Fewer (e.g. 256 when
    fine-tuning bart.base, which has 1024): positions are absolute, so the first rows are kept. More (inputs longer
    than the checkpoint was trained on): the trained rows are copied again and again after themselves, as
    Longformer/LED's conversion of BART extended them, so position p starts as position p mod n did and the
    first n positions compute exactly what they computed before. fairseq's two offset rows (padding index + 1)
    stay first. Logs one line."""
    expected = model.state_dict()
    out, cut, grown = dict(state), [], []
    for key in POSITION_KEYS:
        if key not in state or key not in expected:
            continue
        have, rows = state[key].shape[0], expected[key].shape[0]
        side = key.split(".")[0]
        if have > rows:
            out[key] = state[key][:rows].clone()
            cut.append(f"{side} {have}->{rows}")
        elif have < rows and have > POSITION_OFFSET and state[key].shape[1:] == expected[key].shape[1:]:
            out[key] = extend_positions(state[key], rows)
            grown.append(f"{side} {have - POSITION_OFFSET}->{rows - POSITION_OFFSET} positions")
    if cut:
        logger.info(
            f"{where}: kept the first positions of the learned position embeddings ({'; '.join(cut)} "
            f"rows), as --max-source-positions / --max-target-positions ask"
        )
    if grown:
        logger.info(
            f"{where}: extended the learned position embeddings by copying the trained rows ({'; '.join(grown)}), "
            "as --max-source-positions / --max-target-positions ask"
        )
    return out


def _layer_count(state: dict[str, torch.Tensor], side: str) -> int:
    found = [int(m.group(1)) for k in state if (m := re.match(rf"{side}\.layers\.(\d+)\.", k))]
    return max(found) + 1 if found else 0


def parse_layers_to_keep(value: Any, flag: str) -> list[int] | None:
    """--encoder/--decoder-layers-to-keep "0,5,11" as sorted layer indices (fairseq sorts them too)."""
    if value in (None, ""):
        return None
    try:
        layers = [int(x) for x in str(value).split(",")]
    except ValueError:
        raise SeqtrainError(
            f"{flag}: expected comma-separated layer indices like 0,5,11, got {value!r}"
        ) from None
    if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
        raise SeqtrainError(f"{flag}: layer indices must be distinct and >= 0, got {value!r}")
    return sorted(layers)


def keep_layers(state: dict[str, torch.Tensor], cfg: Any, where: str) -> dict[str, torch.Tensor]:
    """fairseq's prune_state_dict: with --encoder-layers-to-keep / --decoder-layers-to-keep, keep those layers
    of a deeper checkpoint, renumbered 0, 1, ... in index order (how DistilBART's students were made); the other
    layers are dropped. A state that already has as many layers as are kept (the student's own checkpoint, a
    resume) is left as it is. Logs one line."""
    out, done = dict(state), []
    for side in ("encoder", "decoder"):
        flag = f"--{side}-layers-to-keep"
        keep = parse_layers_to_keep(getattr(cfg, f"{side}_layers_to_keep", None), flag)
        have = _layer_count(state, side)
        if keep is None or have == len(keep):
            continue
        if keep[-1] >= have:
            raise SeqtrainError(
                f"{where}: {flag} {keep[-1]}: the checkpoint has {have} {side} layers (0-{have - 1})"
            )
        new_index = {old: new for new, old in enumerate(keep)}
        prefix = re.compile(rf"^({side}\.layers\.)(\d+)(\..*)$")
        for k in state:
            m = prefix.match(k)
            if m is None:
                continue
            del out[k]
            old = int(m.group(2))
            if old in new_index:
                out[f"{m.group(1)}{new_index[old]}{m.group(3)}"] = state[k]
        done.append(f"{side} layers {','.join(map(str, keep))} of {have}")
    if done:
        logger.info(f"{where}: kept {'; '.join(done)}, renumbered from 0")
    return out


def fill_adapters(
    state: dict[str, torch.Tensor], model: torch.nn.Module, where: str
) -> dict[str, torch.Tensor]:
    """LoRA adapters (NAME.lora_A / NAME.lora_B) the model has and `state` lacks (a pretrained model being
    fine-tuned with --lora-rank) start as the model initialised them: B is zero, so the model computes exactly
    what the pretrained one does. Logs one line."""
    missing = [k for k in model.state_dict() if is_lora_key(k) and k not in state]
    if not missing:
        return state
    out = dict(state)
    own = model.state_dict()
    for k in missing:
        out[k] = own[k].detach().clone()
    logger.info(f"{where}: no LoRA adapters in it; {len(missing) // 2} new adapters start at zero")
    return out


def check_state_fits(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Raise a SeqtrainError listing the first mismatching names and shapes, if `state` does not fit
    `model`."""
    expected = model.state_dict()
    for key in POSITION_KEYS:
        if key in state and key in expected and state[key].shape[0] < expected[key].shape[0]:
            side = key.split(".")[0]
            usable = state[key].shape[0] - POSITION_OFFSET
            raise SeqtrainError(
                f"{where}: the checkpoint has learned positions for {usable} {side} tokens, fewer than the model "
                f"asks for; pass --max-{'source' if side == 'encoder' else 'target'}-positions {usable} or less"
            )
    shapes = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if not (shapes or missing or unexpected):
        return
    parts = []
    for label, items in (("shape mismatch", shapes), ("missing", missing), ("unexpected", unexpected)):
        if items:
            more = f" (+{len(items) - 4} more)" if len(items) > 4 else ""
            parts.append(f"{label}: {', '.join(items[:4])}{more}")
    raise SeqtrainError(f"{where}: weights do not fit the model architecture: {'; '.join(parts)}")
