"""Token blocks: the lines of a monolingual data-bin cut into training examples (fairseq 0.12's TokenBlockDataset
as its denoising task builds it, `--sample-break-mode` and `--tokens-per-sample`).

The lines (each stored as `tokens </s>`) are read as one stream without their `</s>`; a block is a slice of
that stream. Where the slices fall is decided from the *stored* line lengths, `</s>` included, as fairseq 0.12's
denoising task does (it strips `</s>` but hands TokenBlockDataset the unstripped sizes), so the blocks, their
recorded sizes and hence the batches are fairseq's:

- `none`: fixed slices of `block_size` positions, cut anywhere;
- `complete`: whole lines, as many as fit in `block_size` (a longer line is a block of its own);
- `complete_doc`: as `complete`, but a block never crosses a document break (a line of recorded size
  `document_sep_len`; fairseq's denoising task passes 0, which no stored line has, so in practice no break
  occurs) and a block of 1 position or less is dropped;
- `eos`: one line per block.

A block's recorded size counts one position per line end, so it can exceed the tokens it holds by the number
of lines it spans; batching and length filtering use the recorded size, as fairseq does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

BREAK_MODES = ("none", "complete", "complete_doc", "eos")


def block_slices(
    sizes: np.ndarray, break_mode: str, block_size: int, document_sep_len: int = 0
) -> np.ndarray:
    """The (start, end) positions of every block in the stream of `sizes`, an N x 2 int64 array."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if break_mode not in BREAK_MODES:
        raise ValueError(f"invalid break mode {break_mode!r}; choose from {', '.join(BREAK_MODES)}")
    if break_mode == "eos":
        ends = np.cumsum(sizes)
        return np.stack([ends - sizes, ends], axis=1)
    if break_mode == "none":
        total = int(sizes.sum())
        starts = np.arange(0, total, block_size, dtype=np.int64)
        return np.stack([starts, np.minimum(starts + block_size, total)], axis=1).reshape(-1, 2)
    doc = break_mode == "complete_doc"
    keep_min = 1 if doc else 0  # complete_doc keeps blocks longer than 1 position only
    out: list[tuple[int, int]] = []
    start = used = 0
    i = 0
    while i < len(sizes):
        size = int(sizes[i])
        is_break = doc and size == document_sep_len
        if not is_break and (used == 0 or used + size <= block_size):
            used += size
            i += 1
            continue
        if used > keep_min:
            out.append((start, start + used))
        start += used
        used = 0
        if is_break:
            start += size
            i += 1
    if used > keep_min:
        out.append((start, start + used))
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


class TokenBlockDataset(torch.utils.data.Dataset):
    """Blocks of the lines of `dataset` (1-D token tensors, each ending in `strip`, e.g. `</s>`).

    `sizes` are the stored line lengths, which place the blocks (see the module docstring); `self.sizes` are
    the blocks' recorded sizes. `block[i]` is the stream of stripped lines from the line holding the block's
    start, read from that start for the block's length (or to the end of the lines it spans)."""

    def __init__(
        self,
        dataset: Sequence,
        sizes: Sequence[int],
        block_size: int,
        break_mode: str = "complete_doc",
        strip: int | None = None,
        document_sep_len: int = 0,
    ):
        if len(dataset) != len(sizes):
            raise ValueError(f"{len(dataset)} lines but {len(sizes)} sizes")
        self.dataset = dataset
        self.strip = strip
        line_sizes = np.asarray(sizes, dtype=np.int64)
        self.slices = block_slices(line_sizes, break_mode, block_size, document_sep_len)
        self.sizes = (self.slices[:, 1] - self.slices[:, 0]).astype(np.int64)
        line_ends = np.cumsum(line_sizes)
        # the line holding each block's first position, and the first position's offset inside that line
        # (for an empty block: the line where it would start)
        starts = self.slices[:, 0]
        self.first_line = np.searchsorted(line_ends, starts, side="right")
        line_starts = np.concatenate(
            [[0], line_ends]
        )  # one more entry: a block may start after the last line
        self.first_offset = starts - line_starts[self.first_line]
        last = np.maximum(self.slices[:, 1] - 1, starts)
        self.last_line = np.maximum(np.searchsorted(line_ends, last, side="right"), self.first_line)

    def __len__(self) -> int:
        return len(self.slices)

    def _line(self, i: int) -> torch.Tensor:
        item = torch.as_tensor(self.dataset[i], dtype=torch.long)
        if self.strip is not None:
            lo, hi = 0, len(item)
            while hi > lo and int(item[hi - 1]) == self.strip:
                hi -= 1
            while lo < hi and int(item[lo]) == self.strip:
                lo += 1
            item = item[lo:hi]
        return item

    def __getitem__(self, index: int) -> torch.Tensor:
        first, last = int(self.first_line[index]), int(self.last_line[index])
        if first >= len(self.dataset):
            return torch.zeros(0, dtype=torch.long)
        stream = torch.cat([self._line(i) for i in range(first, last + 1)])
        offset = int(self.first_offset[index])
        return stream[offset : offset + int(self.sizes[index])]
