"""Fitting checkpoint weights to a model: vocabulary rows to the dictionaries, learned positions to
--max-source/target-positions, and one clear error when the weights do not fit the architecture."""

from __future__ import annotations

import logging

import torch

from seqtrain.errors import SeqtrainError

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


def fit_positions(
    state: dict[str, torch.Tensor], model: torch.nn.Module, where: str
) -> dict[str, torch.Tensor]:
    """Cut learned position rows the model does not use (e.g. --max-source-positions 256 when fine-tuning
    bart.base, which has 1024): positions are absolute, so the first rows are the ones kept. Logs one line."""
    expected = model.state_dict()
    out, cut = dict(state), []
    for key in POSITION_KEYS:
        if key in state and key in expected and state[key].shape[0] > expected[key].shape[0]:
            rows = expected[key].shape[0]
            out[key] = state[key][:rows].clone()
            cut.append(f"{key.split('.')[0]} {state[key].shape[0]}->{rows}")
    if cut:
        logger.info(
            f"{where}: kept the first positions of the learned position embeddings ({'; '.join(cut)} "
            f"rows), as --max-source-positions / --max-target-positions ask"
        )
    return out


def check_state_fits(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Raise a SeqtrainError listing the first mismatching names and shapes, if `state` does not fit
    `model`."""
    expected = model.state_dict()
    for key in POSITION_KEYS:
        if key in state and key in expected and state[key].shape[0] < expected[key].shape[0]:
            side = key.split(".")[0]
            usable = state[key].shape[0] - 2  # fairseq's offset: padding index + 1 rows come first
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
