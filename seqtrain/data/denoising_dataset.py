"""The denoising dataset (BART pretraining, fairseq 0.12's DenoisingDataset): each example is a token block
`<s> tokens </s>`; the target is the block, the source the block after the noise of seqtrain.data.noise.

Noise is drawn from a generator seeded by (seed, epoch, index) (noise.example_generator), never from a global
one, so an example's source is the same in any DataLoader worker, on any rank, and after a resume mid-epoch.
The epoch lives in shared memory (`set_epoch`), so persistent DataLoader workers forked earlier see it.

Also here: which vocabulary entries begin a word (`word_start_table`, for --mask-length word / span-poisson)
and which token ends a sentence (`full_stop_index`, for --permute-sentences), both from the tokenizer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqtrain.data.dictionary import Dictionary
from seqtrain.data.noise import Noise, example_generator
from seqtrain.data.pair_dataset import collate_pairs
from seqtrain.data.token_blocks import TokenBlockDataset
from seqtrain.data.tokenizer import Tokenizer

SPM_WORD_START = "\u2581"


def word_start_table(dictionary: Dictionary, tokenizer: Tokenizer) -> torch.Tensor | None:
    """1 per vocabulary index that begins a word, else 0; None for the `none` tokenizer (every symbol is a
    word). The special symbols and `madeupword` padding begin words; `<mask>` does not. sentencepiece: a piece
    starting with '▁'; gpt2: an id whose text starts with a space (a symbol that is not an id begins a word).
    fairseq's get_whole_word_mask, with the tokenizer of the data-bin in place of --bpe."""
    kind = tokenizer.kind
    if kind == "none":
        return None
    flags = []
    for i, sym in enumerate(dictionary.symbols):
        if i < dictionary.nspecial or sym.startswith("madeupword"):
            flags.append(1)
        elif sym == "<mask>":
            flags.append(0)
        elif kind == "sentencepiece":
            flags.append(int(sym.startswith(SPM_WORD_START)))
        elif kind == "gpt2":
            flags.append(int(tokenizer.decode(sym).startswith(" ")) if sym.isdigit() else 1)
        else:
            raise ValueError(f"no word starts for tokenizer kind {kind!r}")
    return torch.tensor(flags, dtype=torch.long)


def full_stop_index(dictionary: Dictionary, tokenizer: Tokenizer) -> int:
    """The token that ends a sentence for --permute-sentences: GPT-2's '.' (id 13) as fairseq; for other
    tokenizers the symbol '.' when the dictionary has it (fairseq uses `</s>`, which its denoising task strips
    from every line, so there it never permutes anything), else `</s>`."""
    if tokenizer.kind == "gpt2" and "13" in dictionary:
        return dictionary.index("13")
    if tokenizer.kind != "gpt2" and "." in dictionary:
        return dictionary.index(".")
    return dictionary.eos()


class DenoisingDataset(torch.utils.data.Dataset):
    """Examples `{"id", "source": noised block, "target": block}` over `blocks` (a TokenBlockDataset of
    stripped lines); `<s>` and `</s>` are added around each block here. Sources and targets are padded on the
    right, as fairseq's denoising collater does."""

    def __init__(
        self,
        blocks: TokenBlockDataset,
        dictionary: Dictionary,
        noise: Noise,
        seed: int = 1,
        shuffle: bool = False,
        fixed_epoch: int | None = None,
    ):
        self.blocks = blocks
        self.dictionary = dictionary
        self.noise = noise
        self.seed = int(seed)
        self.shuffle = shuffle
        self.sizes = (
            np.asarray(blocks.sizes, dtype=np.int64) + 2
        )  # fairseq's recorded sizes, <s> and </s> added
        self.fixed_epoch = fixed_epoch  # validation: the same noise at every validation
        self._epoch = torch.full((1,), fixed_epoch or 1, dtype=torch.long).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Noise of `epoch` from now on, in this process and in the DataLoader workers it forked (a dataset
        made with `fixed_epoch` keeps that one)."""
        if self.fixed_epoch is None:
            self._epoch[0] = int(epoch)

    def __len__(self) -> int:
        return len(self.blocks)

    def block(self, index: int) -> torch.Tensor:
        """`<s> tokens </s>` of block `index`, before the noise."""
        d = self.dictionary
        return torch.cat([torch.tensor([d.bos()]), self.blocks[index], torch.tensor([d.eos()])])

    def __getitem__(self, index: int) -> dict[str, Any]:
        target = self.block(index)
        source = self.noise(target, example_generator(self.seed, self.epoch, int(index)))
        return {"id": int(index), "source": source, "target": target}

    def collater(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        d = self.dictionary
        return collate_pairs(
            samples,
            d.pad(),
            d.eos(),
            left_pad_source=False,
            left_pad_target=False,
        )

    # -- sizes, for filtering and batching without reading the data ------------------------------------------
    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def num_tokens_vec(self, indices: np.ndarray) -> np.ndarray:
        return self.sizes[indices]

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def ordered_indices(self, seed: int | None = 1) -> np.ndarray:
        """Indices by recorded size (stable), after a shuffle drawn from `seed` with --shuffle-instance (fairseq:
        inside numpy_seed(seed); otherwise in index order)."""
        if self.shuffle:
            indices = np.random.RandomState(seed).permutation(len(self)).astype(np.int64)
        else:
            indices = np.arange(len(self), dtype=np.int64)
        return indices[np.argsort(self.sizes[indices], kind="mergesort")]
