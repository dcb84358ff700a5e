"""Token blocks (seqtrain/data/token_blocks.py): where each --sample-break-mode cuts, measured with each line's
`</s>` as fairseq 0.12's denoising task measures, and what a block holds (the lines without their `</s>`).
(Against fairseq's own TokenBlockDataset on random lines: tests/peers/test_fairseq_denoising.py.)"""

from __future__ import annotations

import pytest
import torch

from seqtrain.data.token_blocks import TokenBlockDataset, block_slices

# stored lines `tokens </s>` (eos = 2) of lengths 4, 3, 6, 1 (a blank line), 3
LINES = [[10, 11, 12, 2], [13, 14, 2], [15, 16, 17, 18, 19, 2], [2], [20, 21, 2]]
SIZES = [len(x) for x in LINES]


@pytest.mark.parametrize(
    ("mode", "block", "slices"),
    [
        ("none", 5, [(0, 5), (5, 10), (10, 15), (15, 17)]),
        ("complete", 7, [(0, 7), (7, 14), (14, 17)]),  # 4+3 | 6+1 | 3
        ("complete", 5, [(0, 4), (4, 7), (7, 13), (13, 17)]),  # the 6-line is a block of its own
        ("complete_doc", 7, [(0, 7), (7, 14), (14, 17)]),  # no line has size 0: no document break
        ("eos", 1, [(0, 4), (4, 7), (7, 13), (13, 14), (14, 17)]),
    ],
)
def test_block_slices(mode, block, slices):
    assert block_slices(SIZES, mode, block).tolist() == [list(s) for s in slices]


def test_complete_doc_breaks_at_document_separators_and_drops_one_position_blocks():
    # with document_sep_len 1 the blank line (size 1) separates documents; a 1-position document is dropped
    assert block_slices([4, 3, 1, 1, 1, 3], "complete_doc", 100, document_sep_len=1).tolist() == [
        [0, 7],
        [10, 13],
    ]
    assert block_slices([1, 4], "complete_doc", 1).tolist() == [[1, 5]]  # the first block (0, 1) is dropped


def test_blocks_hold_the_lines_without_their_eos():
    lines = [torch.tensor(x) for x in LINES]
    blocks = TokenBlockDataset(lines, SIZES, 7, break_mode="complete", strip=2)
    assert [blocks[i].tolist() for i in range(len(blocks))] == [
        [10, 11, 12, 13, 14],
        [15, 16, 17, 18, 19],
        [20, 21],
    ]
    assert blocks.sizes.tolist() == [7, 7, 3]  # recorded sizes count each line's </s>
    # none: slices placed by the stored sizes but read from the stream of stripped lines, from the line and
    # offset where the slice starts (fairseq 0.12's reading: tokens near a cut repeat or go missing)
    flat = TokenBlockDataset(lines, SIZES, 5, break_mode="none", strip=2)
    assert [flat[i].tolist() for i in range(len(flat))] == [
        [10, 11, 12, 13, 14],
        [14, 15, 16, 17, 18],
        [18, 19, 20, 21],
        [21],
    ]
