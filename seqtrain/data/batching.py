"""Length-bucketed token batches (fairseq's filter_indices_by_size + batch_by_size, same results).

Indices come in sorted by length (`dataset.ordered_indices()`), so consecutive examples have similar lengths and
little padding. A batch costs `len(batch) * max(num_tokens)`, padding included, which is what `--max-tokens`
bounds; `--batch-size` caps the number of sentences; `--required-batch-size-multiple` makes batch sizes
multiples of N where the bound allows it (tensor-core friendly shapes).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seqtrain.errors import SeqtrainError

logger = logging.getLogger(__name__)

MaxPositions = None | int | tuple[int | None, int | None]


def resolve_max_positions(*limits: MaxPositions) -> MaxPositions:
    """Element-wise minimum of limits given as ints or (src, tgt) pairs; None means no limit.

    The task passes (its limits, the model's limits, --max-tokens), as fairseq does, so an example longer than
    --max-tokens is caught by `filter_by_size` with a clear message rather than inside batching.
    """
    result: list[int | None] | None = None
    for lim in limits:
        if lim is None:
            continue
        pair = [lim, lim] if isinstance(lim, (int, np.integer)) else list(lim)
        if result is None:
            result = pair
            continue
        result = [a if b is None else b if a is None else min(a, b) for a, b in zip(result, pair)]
    return None if result is None else (result[0], result[1])


def filter_by_size(
    indices: np.ndarray,
    dataset: Any,
    max_positions: MaxPositions,
    ignore_invalid_inputs: bool = False,
    split: str = "train",
) -> np.ndarray:
    """Drop (with a warning) or refuse (SeqtrainError) examples longer than `max_positions`.

    `max_positions` is an int or a (source, target) pair. The dataset needs `src_sizes` (and `tgt_sizes`,
    possibly None), or a `sizes` array (1-D, or N x 2 as fairseq's LanguagePairDataset.sizes).
    Returns the kept indices in their original order.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if max_positions is None:
        return indices
    max_src, max_tgt = (max_positions, max_positions) if np.isscalar(max_positions) else max_positions
    src_sizes = getattr(dataset, "src_sizes", None)
    tgt_sizes = getattr(dataset, "tgt_sizes", None)
    if src_sizes is None:  # a dataset with only `sizes`: 1-D (source only) or N x 2 (source, target)
        sizes = np.asarray(dataset.sizes)
        src_sizes, tgt_sizes = (sizes[:, 0], sizes[:, 1]) if sizes.ndim == 2 else (sizes, None)
    bad = np.zeros(len(indices), dtype=bool)
    if max_src is not None:
        bad |= src_sizes[indices] > max_src
    if tgt_sizes is not None and max_tgt is not None:
        bad |= tgt_sizes[indices] > max_tgt
    if not bad.any():
        return indices
    ignored = indices[bad]
    first = int(ignored[0])
    tgt_len = 0 if tgt_sizes is None else int(tgt_sizes[first])
    if not ignore_invalid_inputs:  # fairseq's words, then where the limit comes from
        raise SeqtrainError(
            f"{split}: Size of sample #{first} is invalid (=({int(src_sizes[first])}, {tgt_len})) since "
            f"max_positions={_positions_repr(max_positions)}, skip this example with "
            f"--skip-invalid-size-inputs-valid-test (or cut sources with --truncate-source; the limit comes "
            f"from --max-source-positions / --max-target-positions)"
        )
    logger.warning(
        "%s: skipping %d examples longer than the limit (source %s, target %s); first few ids: %s",
        split,
        len(ignored),
        max_src,
        max_tgt,
        ignored[:10].tolist(),
    )
    return indices[~bad]


def _positions_repr(max_positions: MaxPositions) -> str:
    """As fairseq prints its max_positions: an int, or a (source, target) tuple."""
    if np.isscalar(max_positions):
        return str(int(max_positions))
    return str(tuple(None if p is None else int(p) for p in max_positions))


def batch_by_size(
    indices: np.ndarray,
    num_tokens_fn: Callable[[int], int] | None = None,
    num_tokens_vec: np.ndarray | None = None,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    required_batch_size_multiple: int = 1,
    split: str = "",
) -> list[np.ndarray]:
    """Split `indices` (in order) into batches; returns a list of int64 arrays.

    Token counts come from `num_tokens_vec` (aligned with `indices`, as in fairseq) or `num_tokens_fn(index)`;
    a bound method `dataset.num_tokens` is vectorized through `dataset.num_tokens_vec` when it exists.
    An example longer than `max_tokens` is an error (`split` names the data in its message).
    """
    indices = np.asarray(indices, dtype=np.int64)
    if num_tokens_vec is None:
        if not callable(num_tokens_fn):
            raise TypeError(
                "batch_by_size: num_tokens_fn must be callable; pass per-index counts as num_tokens_vec= "
                "(aligned with indices)"
            )
        owner = getattr(num_tokens_fn, "__self__", None)
        if getattr(num_tokens_fn, "__name__", "") == "num_tokens" and hasattr(owner, "num_tokens_vec"):
            num_tokens_vec = owner.num_tokens_vec(indices)
        else:
            num_tokens_vec = np.fromiter((num_tokens_fn(int(i)) for i in indices), np.int64, len(indices))
    num_tokens_vec = np.asarray(num_tokens_vec, dtype=np.int64)
    if len(num_tokens_vec) != len(indices):
        raise ValueError(f"num_tokens_vec has {len(num_tokens_vec)} entries for {len(indices)} indices")
    if len(indices) == 0:
        return []
    bound = sys.maxsize
    max_tokens = bound if max_tokens is None or max_tokens <= 0 else int(max_tokens)
    max_sentences = bound if max_sentences is None or max_sentences <= 0 else int(max_sentences)
    mult = max(1, int(required_batch_size_multiple))
    too_big = np.flatnonzero(num_tokens_vec > max_tokens)
    if len(too_big):  # fairseq asserts the same; training never gets here (it skips such examples first)
        k = int(too_big[0])
        raise SeqtrainError(
            f"{split + ': ' if split else ''}Sentences lengths should not exceed max_tokens={max_tokens} "
            f"(example {int(indices[k])} has {int(num_tokens_vec[k])} tokens); raise --max-tokens (for "
            f"validation: --max-tokens-valid; --skip-invalid-size-inputs-valid-test does not skip these)"
        )
    ends = _batch_ends(num_tokens_vec.tolist(), max_tokens, max_sentences, mult)
    return np.split(indices, ends[:-1])


def _batch_ends(ntok: list[int], max_tokens: int, max_sentences: int, mult: int) -> list[int]:
    """End positions (exclusive) of the batches, greedy left to right.

    The open batch is [start, pos). `cut` is its last end at which the size was "good" (a multiple of `mult`,
    or smaller than `mult`); the elements after it form the tail. When adding `pos` would break a bound, the
    batch is closed at `cut` and the tail starts the next batch; if the tail plus `pos` still breaks a bound
    (possible because `pos` may be longer), the tail becomes a batch of its own. So every closed batch fits the
    bounds and has a good size or is a tail (< mult): the batches of fairseq 0.12's batch_by_size_vec.
    A plain loop over Python ints: about 0.5 s per million examples, once per run (batches are frozen).
    """
    ends: list[int] = []
    start = cut = 0
    run_max = tail_max = 0  # longest example in [start, pos) and in [cut, pos)
    for pos, t in enumerate(ntok):
        size = pos + 1 - start
        bmax = run_max if run_max > t else t
        if size > max_sentences or size * bmax > max_tokens:
            ends.append(cut)
            start = cut
            bmax = tail_max if tail_max > t else t
            size = pos + 1 - start
            if size > max_sentences or size * bmax > max_tokens:
                if cut < pos:
                    ends.append(pos)
                start, bmax, size = pos, t, 1
        run_max = bmax
        if size < mult or size % mult == 0:
            cut = pos + 1
            tail_max = 0
        elif t > tail_max:
            tail_max = t
    if cut < len(ntok):  # a tail after the last good size ends the epoch as a batch of its own (as fairseq)
        ends.append(cut)
    ends.append(len(ntok))
    return ends


def batch_stats(batches: Sequence[np.ndarray], num_tokens_vec_all: np.ndarray) -> dict:
    """Summary for logs and the README: batch count, sentences per batch, padded-token fill ratio."""
    if not batches:
        return {"batches": 0, "sentences": 0, "mean_batch": 0.0, "fill": 0.0}
    sizes = np.array([len(b) for b in batches])
    real = sum(int(num_tokens_vec_all[b].sum()) for b in batches)
    padded = sum(int(num_tokens_vec_all[b].max()) * len(b) for b in batches if len(b))
    return {
        "batches": len(batches),
        "sentences": int(sizes.sum()),
        "mean_batch": float(sizes.mean()),
        "fill": real / padded if padded else 0.0,
    }
