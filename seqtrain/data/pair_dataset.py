"""Source/target pairs and how they become a padded batch (fairseq's LanguagePairDataset convention).

One convention for training and generation alike (docs/data.md, "Sequence convention"):
source = `tokens </s>`, left-padded by default; target = `tokens </s>`, right-padded; the decoder input
`prev_output_tokens` is the target with its final `</s>` moved to the front. `prepend_bos` puts `<s>` first on
both sides (as Hugging Face BART does). `truncate_source` cuts long sources to fit `max_source_positions`.
mBART's language tokens (fairseq's `append_source_id`, translation_from_pretrained_bart): `append_source` and
`append_target` go last on their side (`tokens </s> [lang]`), and `eos` (the target's `[lang]`) is the token moved
to the front of the decoder input (`[lang] tokens </s>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seqtrain.data.iterators import pinned
from seqtrain.errors import SeqtrainError


def _as_long(item: Any) -> torch.Tensor:
    return torch.as_tensor(item, dtype=torch.long)


def pad_sequences(
    seqs: Sequence[torch.Tensor], pad_idx: int, left_pad: bool, pad_to_multiple: int = 1
) -> torch.Tensor:
    """Stack 1-D tensors into a B x T matrix filled with `pad_idx`, aligned left or right."""
    width = max((len(s) for s in seqs), default=0)
    if pad_to_multiple > 1 and width % pad_to_multiple:
        width += pad_to_multiple - width % pad_to_multiple
    out = torch.full((len(seqs), width), pad_idx, dtype=torch.long)
    for row, s in enumerate(seqs):
        if left_pad:
            out[row, width - len(s) :] = s
        else:
            out[row, : len(s)] = s
    return out


# Max lengths are rounded up to a multiple of this, so the ints a run's kernels and compiled layers see repeat
# (models/varlen.py: the varlen kernel only sizes its grid by them).
LENGTH_BUCKET = 64


def bucketed(length: int, bucket: int = LENGTH_BUCKET) -> int:
    """`length` rounded up to a multiple of `bucket` (at least one bucket)."""
    return max(bucket, -(-length // bucket) * bucket)


def batch_layout(src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor, pad_idx: int) -> dict[str, Any]:
    """The packed form of a batch, found here on the CPU so the model runs packed end to end and never waits
    for the device (models/bart.py). For each side ("src": src_tokens, "tgt": prev_output_tokens):
    `{side}_tokens` (the N real tokens, row by row), `{side}_positions` (their position ids, as
    models.transformer.make_positions gives them), `{side}_cu_seqlens` (int32, B + 1 cumulative lengths),
    `{side}_cu_seqlens_host` (a copy of it that stays on the host: Trainer.prepare_sample leaves keys ending in
    `_host` where they are; the CPU reference attention reads its bounds there) and `{side}_max_len` (a host
    int: the longest row rounded up by `bucketed`)."""
    layout: dict[str, Any] = {}
    for side, tokens in (("src", src_tokens), ("tgt", prev_output_tokens)):
        keep = tokens.ne(pad_idx)
        lengths = keep.sum(1)
        cu = torch.zeros(tokens.size(0) + 1, dtype=torch.int32)
        torch.cumsum(lengths, 0, out=cu[1:])
        layout[f"{side}_tokens"] = tokens[keep]
        layout[f"{side}_positions"] = keep.cumsum(1)[keep] + pad_idx
        layout[f"{side}_cu_seqlens"] = cu
        layout[f"{side}_cu_seqlens_host"] = cu.clone()
        layout[f"{side}_max_len"] = bucketed(int(lengths.max()) if len(lengths) else 0)
    return layout


def split_batch(batch: dict[str, Any], pad_idx: int) -> list:
    """A collated training batch as two: the first half of its rows and the rest, each with the columns that
    are padding in all its rows dropped and its layout, target rows and token count made again (on the CPU, as
    the collater makes them). The two hold the same examples, so their sample sizes add up to the batch's."""
    n = batch["nsentences"]
    if n < 2:
        raise ValueError("a batch of one example cannot be split")
    halves = []
    for rows in (slice(0, n // 2), slice(n // 2, n)):
        net = batch["net_input"]
        src = net["src_tokens"][rows]
        src = src[:, src.ne(pad_idx).any(0)]
        prev, target = net["prev_output_tokens"][rows], batch["target"][rows]
        cols = target.ne(pad_idx).any(0) | prev.ne(pad_idx).any(0)
        prev, target = prev[:, cols], target[:, cols]
        halves.append(
            {
                "id": batch["id"][rows],
                "nsentences": src.size(0),
                "ntokens": int(target.ne(pad_idx).sum()),
                "net_input": {
                    "src_tokens": src,
                    "src_lengths": net["src_lengths"][rows],
                    "prev_output_tokens": prev,
                    "layout": batch_layout(src, prev, pad_idx),
                },
                "target": target,
                "target_rows": target.ne(pad_idx).reshape(-1).nonzero().squeeze(1),
            }
        )
    return halves


def padded_shape(batch: dict[str, Any]) -> tuple[int, int]:
    """(rows, width) of a collated batch: width is its longer side's padded length, so rows x width is what
    --max-tokens bounds (an example costs its longer side; a batch is padded to its longest row)."""
    width = batch["net_input"]["src_tokens"].size(1)
    if batch.get("target") is not None:
        width = max(width, batch["target"].size(1))
    return batch["net_input"]["src_tokens"].size(0), width


def merge_plan(shapes: Sequence[tuple[int, int]], max_tokens: int) -> list[list[int]]:
    """Which of an update's batches (their padded_shape, in order) run as one pass: groups of consecutive
    batches, each group as long as its merged batch (all rows, padded to the widest) holds at most `max_tokens`
    token slots; a batch that fits with none forms its own group. A function of the shapes and the budget
    alone (never of free memory), so a resumed run merges as the unbroken one."""
    groups: list[list[int]] = []
    rows = width = 0
    for i, (r, w) in enumerate(shapes):
        if groups and (rows + r) * max(width, w) <= max_tokens:
            groups[-1].append(i)
            rows, width = rows + r, max(width, w)
        else:
            groups.append([i])
            rows, width = r, w
    return groups


def shift_eos_to_front(target: torch.Tensor, eos_idx: int) -> torch.Tensor:
    """Decoder input for teacher forcing: `a b c </s>` -> `</s> a b c` (fairseq's move_eos_to_beginning)."""
    out = target.new_empty(target.shape)
    if len(target):
        out[0] = eos_idx
        out[1:] = target[:-1]
    return out


def collate_pairs(
    samples: list[dict[str, Any]],
    pad: int,
    eos: int,
    left_pad_source: bool = True,
    left_pad_target: bool = False,
    pad_to_multiple: int = 1,
) -> dict[str, Any]:
    """Items `{"id", "source", "target"}` padded into a batch, rows sorted by source length (longest first), as
    fairseq does (LanguagePairDataset.collater; the denoising dataset pads its sources on the right).

    With targets, the batch also carries what the model and the loss would otherwise find on the device,
    at the cost of a host-device sync: `net_input["layout"]` (batch_layout) and `target_rows`, the flat
    positions of the non-pad tokens of `target`.

    An empty list gives `{}`: the filler batch of a rank that ran out of batches (see iterators.py).
    """
    if not samples:
        return {}
    src_lengths = torch.tensor([len(s["source"]) for s in samples], dtype=torch.long)
    # Stable sort: ties keep their batch order, so a batch always collates to the same tensor.
    src_lengths, order = src_lengths.sort(descending=True, stable=True)
    ordered = [samples[i] for i in order.tolist()]
    batch: dict[str, Any] = {
        "id": torch.tensor([s["id"] for s in ordered], dtype=torch.long),
        "nsentences": len(samples),
        "net_input": {
            "src_tokens": pad_sequences(
                [s["source"] for s in ordered], pad, left_pad_source, pad_to_multiple
            ),
            "src_lengths": src_lengths,
        },
        "target": None,
    }
    if ordered[0]["target"] is None:
        batch["ntokens"] = int(src_lengths.sum())
        return batch
    targets = [s["target"] for s in ordered]
    batch["target"] = pad_sequences(targets, pad, left_pad_target, pad_to_multiple)
    batch["net_input"]["prev_output_tokens"] = pad_sequences(
        [shift_eos_to_front(t, eos) for t in targets], pad, left_pad_target, pad_to_multiple
    )
    batch["ntokens"] = sum(len(t) for t in targets)
    batch["net_input"]["layout"] = batch_layout(
        batch["net_input"]["src_tokens"], batch["net_input"]["prev_output_tokens"], pad
    )
    batch["target_rows"] = batch["target"].ne(pad).reshape(-1).nonzero().squeeze(1)
    return batch


class LanguagePairDataset(torch.utils.data.Dataset):
    """Pairs `src[i]` with `tgt[i]`; `src`/`tgt` are any indexables of 1-D integer tensors (e.g. MMapIndexedDataset).

    `src_sizes`/`tgt_sizes` give the stored lengths; `self.src_sizes`/`self.tgt_sizes` are the sizes that
    ordering, filtering and batching use, so they never read the data: the lengths of what `__getitem__`
    returns (after truncation and `<s>`), except that with `truncate_source` a source that is not cut counts
    one token more. That is the size fairseq records for it (its strip-`</s>` / truncate / append-`</s>` chain
    keeps the stored length, `</s>` included, then adds one), so the batches are fairseq's.
    """

    def __init__(
        self,
        src: Sequence,
        src_sizes: Sequence[int],
        src_dict: Any,
        tgt: Sequence | None = None,
        tgt_sizes: Sequence[int] | None = None,
        tgt_dict: Any | None = None,
        left_pad_source: bool = True,
        left_pad_target: bool = False,
        shuffle: bool = True,
        prepend_bos: bool = False,
        truncate_source: bool = False,
        max_source_positions: int = 1024,
        max_target_positions: int = 1024,
        pad_to_multiple: int = 1,
        append_source: int | None = None,
        append_target: int | None = None,
        eos: int | None = None,
    ):
        if len(src) != len(src_sizes):
            raise ValueError(f"source has {len(src)} items but {len(src_sizes)} sizes")
        if tgt is not None:
            if tgt_sizes is None:
                tgt_sizes = getattr(tgt, "sizes", None)
            if tgt_sizes is None or len(tgt) != len(tgt_sizes):
                raise ValueError("target needs one size per item (tgt_sizes)")
            if len(tgt) != len(src):
                raise SeqtrainError(
                    f"source and target have different numbers of examples ({len(src)} vs {len(tgt)})"
                )
        tgt_dict = tgt_dict if tgt_dict is not None else src_dict
        # One pad/eos id for both sides: the model and the loss assume it (fairseq asserts the same).
        if tgt is not None and (src_dict.pad() != tgt_dict.pad() or src_dict.eos() != tgt_dict.eos()):
            raise SeqtrainError("source and target dictionaries disagree on the <pad>/</s> ids")
        self.src, self.tgt = src, tgt
        self.src_dict, self.tgt_dict = src_dict, tgt_dict
        self.left_pad_source, self.left_pad_target = left_pad_source, left_pad_target
        self.shuffle = shuffle
        self.prepend_bos = prepend_bos
        self.truncate_source = truncate_source
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions
        self.pad_to_multiple = pad_to_multiple
        self.append_source, self.append_target = append_source, append_target
        self.eos = src_dict.eos() if eos is None else eos
        src_extra = int(prepend_bos) + int(append_source is not None)

        # Sources are cut so that the final item, <s> and a language token included, fits max_source_positions
        # (fairseq cuts before prepending <s>, which makes such items one too long for the model; we keep them
        # valid instead).
        self._src_limit = max_source_positions - src_extra
        if truncate_source and self._src_limit < 2:
            raise SeqtrainError(f"--truncate-source needs --max-source-positions of at least {2 + src_extra}")
        src_sizes = np.asarray(src_sizes, dtype=np.int64)
        if truncate_source:  # fairseq's recorded sizes: see the class docstring
            src_sizes = np.minimum(src_sizes + 1, self._src_limit)
        self.src_sizes = src_sizes + src_extra
        tgt_extra = int(prepend_bos) + int(append_target is not None)
        self.tgt_sizes = None if tgt is None else np.asarray(tgt_sizes, dtype=np.int64) + tgt_extra
        self._sizes = (
            self.src_sizes if self.tgt_sizes is None else np.stack([self.src_sizes, self.tgt_sizes], axis=1)
        )

    def __len__(self) -> int:
        return len(self.src)

    @property
    def source_limit(self) -> int:
        """The longest source (tokens with its </s>) kept whole with truncate_source; longer ones are cut."""
        return self._src_limit

    def __getitem__(self, index: int) -> dict[str, Any]:
        src = _as_long(self.src[index])
        if self.truncate_source and len(src) > self._src_limit:
            src = torch.cat([src[: self._src_limit - 1], src.new_tensor([self.src_dict.eos()])])
        tgt = None if self.tgt is None else _as_long(self.tgt[index])
        if self.prepend_bos:
            src = torch.cat([src.new_tensor([self.src_dict.bos()]), src])
            if tgt is not None:
                tgt = torch.cat([tgt.new_tensor([self.tgt_dict.bos()]), tgt])
        if self.append_source is not None:
            src = torch.cat([src, src.new_tensor([self.append_source])])
        if tgt is not None and self.append_target is not None:
            tgt = torch.cat([tgt, tgt.new_tensor([self.append_target])])
        return {"id": int(index), "source": src, "target": tgt}

    def merge_batches(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        """One collated batch of the examples of `batches` (collated training batches of this dataset, empty
        ones skipped): tensor for tensor what `collater` makes of all their items, in the batches' order.

        Made from the batches' tensors, without a loop over rows (this runs on the training loop's thread):
        each side is padded out to the widest batch on this dataset's padding side (a batch's width is its
        longest row, rounded up to `pad_to_multiple`, so the widest is the merged batch's width), the rows are
        concatenated and sorted by source length with the collater's stable sort. Each batch's rows are already
        in that order, ties in item order, so the order is the collater's for the batches' items in turn."""
        real = [b for b in batches if b]
        pad = self.src_dict.pad()

        def stacked(tensors: list[torch.Tensor], left: bool) -> torch.Tensor:
            width = max(t.size(1) for t in tensors)
            sides = [(width - t.size(1), 0) if left else (0, width - t.size(1)) for t in tensors]
            return torch.cat([torch.nn.functional.pad(t, s, value=pad) for t, s in zip(tensors, sides)])

        lengths, order = torch.cat([b["net_input"]["src_lengths"] for b in real]).sort(
            descending=True, stable=True
        )
        src = stacked([b["net_input"]["src_tokens"] for b in real], self.left_pad_source)[order]
        target = stacked([b["target"] for b in real], self.left_pad_target)[order]
        prev = stacked([b["net_input"]["prev_output_tokens"] for b in real], self.left_pad_target)[order]
        layout = batch_layout(src, prev, pad)
        return {
            "id": torch.cat([b["id"] for b in real])[order],
            "nsentences": sum(b["nsentences"] for b in real),
            "net_input": {
                "src_tokens": src,
                "src_lengths": lengths,
                "prev_output_tokens": prev,
                "layout": layout,
            },
            "target": target,
            "ntokens": sum(b["ntokens"] for b in real),
            "target_rows": target.ne(pad).reshape(-1).nonzero().squeeze(1),
        }

    def merge_update(self, batches: list[dict[str, Any]], max_tokens: int) -> list[dict[str, Any]]:
        """An update's batches (--update-freq) as few forward/backward passes as `max_tokens` allows:
        consecutive batches merge while the merged batch, padded, holds at most `max_tokens` token slots (see
        merge_plan). Batches that merge with none stay as they are; empty ones (a short shard's) are left out
        when a real one is there."""
        real = [b for b in batches if b]
        if len(real) < 2:
            return real or batches
        out = []
        for group in merge_plan([padded_shape(b) for b in real], max_tokens):
            merged = real[group[0]] if len(group) == 1 else self.merge_batches([real[i] for i in group])
            if len(group) > 1 and real[group[0]]["net_input"]["src_tokens"].is_pinned():
                merged = pinned(merged)  # as the iterator handed the batches over
            out.append(merged)
        return out

    def collater(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Pad a list of items into a batch (collate_pairs: rows longest source first; `[]` gives `{}`)."""
        return collate_pairs(
            samples,
            self.src_dict.pad(),
            self.eos,
            self.left_pad_source,
            self.left_pad_target,
            self.pad_to_multiple,
        )

    # -- sizes, for filtering and batching without reading the data ------------------------------------------

    @property
    def sizes(self) -> np.ndarray:
        """N x 2 array of (source, target) lengths, or the source lengths when there is no target."""
        return self._sizes

    def num_tokens(self, index: int) -> int:
        """Cost of one example for --max-tokens: its longer side (a batch is padded to its longest row)."""
        tgt = 0 if self.tgt_sizes is None else self.tgt_sizes[index]
        return int(max(self.src_sizes[index], tgt))

    def num_tokens_vec(self, indices: np.ndarray) -> np.ndarray:
        sizes = self.src_sizes[indices]
        if self.tgt_sizes is not None:
            sizes = np.maximum(sizes, self.tgt_sizes[indices])
        return sizes

    def size(self, index: int) -> tuple[int, int]:
        tgt = 0 if self.tgt_sizes is None else self.tgt_sizes[index]
        return int(self.src_sizes[index]), int(tgt)

    def ordered_indices(self, seed: int | None = 1) -> np.ndarray:
        """Indices sorted by source length, then target length, ties in a random order drawn from `seed`.

        Matches fairseq's order for the same seed (it calls this inside `numpy_seed(seed)`; a private RandomState
        gives the same permutation without touching numpy's global state). Its training and validation
        iterators pass `--seed` + 1 (see TranslationTask.get_batch_iterator).
        """
        if self.shuffle:
            indices = np.random.RandomState(seed).permutation(len(self)).astype(np.int64)
        else:
            indices = np.arange(len(self), dtype=np.int64)
        if self.tgt_sizes is not None:
            indices = indices[np.argsort(self.tgt_sizes[indices], kind="mergesort")]
        return indices[np.argsort(self.src_sizes[indices], kind="mergesort")]


class UpdateMerge:
    """--merge-max-tokens for one epoch: `dataset.merge_update(batches, max_tokens)` for each update's batches,
    counting the real batches and the passes they ran as (the training loop logs them)."""

    def __init__(self, dataset: LanguagePairDataset, max_tokens: int):
        self.dataset, self.max_tokens = dataset, max_tokens
        self.batches = self.passes = 0

    def __call__(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        passes = self.dataset.merge_update(batches, self.max_tokens)
        self.batches += sum(1 for b in batches if b)
        self.passes += len(passes)
        return passes
