"""fairseq 0.12's `denoising` task (BART pretraining): a monolingual data-bin (`{split}.bin/.idx`, `dict.txt`,
as `seqtrain-preprocess --only-source` writes it) cut into token blocks; the model learns to rebuild each block
from its noised copy.

The task owns the one dictionary (`<mask>` appended, as fairseq does) and the flags of the noise; the datasets
are seqtrain.data.denoising_dataset's. Batching, iterators, the model, the criterion and the steps are the
translation task's, inherited: only what the data is differs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from seqtrain.config import setting, settings
from seqtrain.data.denoising_dataset import DenoisingDataset, full_stop_index, word_start_table
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.indexed_dataset import MMapIndexedDataset, check_token_ids
from seqtrain.data.noise import MASK_LENGTHS, Noise
from seqtrain.data.token_blocks import BREAK_MODES, TokenBlockDataset
from seqtrain.data.tokenizer import build_tokenizer
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import PROBABILITY, Bounds
from seqtrain.registry import TASKS
from seqtrain.tasks import bpe_flags
from seqtrain.tasks.translation import TranslationConfig, TranslationTask

logger = logging.getLogger(__name__)


def _share(default: float, text: str, metavar: str = "P") -> Any:
    return setting(default, text, type=float, metavar=metavar, bounds=PROBABILITY)


@settings
class DenoisingConfig(TranslationConfig):
    """Task (denoising)

    fairseq 0.12's DenoisingConfig flags, names and defaults (the noise: seqtrain.data.noise)."""

    data: str | None = setting(
        None,
        "monolingual data-bin (dict.txt, {split}.bin/.idx from seqtrain-preprocess --only-source), or "
        "several separated by ':', used one per epoch in turn",
        flags="data",
        metavar="DATA",
    )
    tokens_per_sample: int = setting(
        512,
        "positions per block, <s> and </s> included (default: 512)",
        type=int,
        metavar="N",
        bounds=Bounds(3, 1 << 20),  # <s>, one token, </s>
    )
    sample_break_mode: str = setting(
        "complete_doc",
        "where blocks may break: none (anywhere), complete (between lines), complete_doc (between "
        "lines, not across documents), eos (one line per block) (default: complete_doc)",
        choices=BREAK_MODES,
    )
    mask: float = _share(0.0, "share of words (or subwords, by --mask-length) to mask (default: 0.0)")
    mask_random: float = _share(
        0.0, "share of masks (and insertions) that are a random token instead of <mask> (default: 0.0)"
    )
    insert: float = _share(0.0, "insert this share of additional <mask> (or random) tokens (default: 0.0)")
    permute: float = _share(
        0.0,
        "share of the tokens of a block moved to each other's places (fairseq 0.12 "
        "accepts the flag but never applies it)",
    )
    rotate: float = _share(0.5, "share of blocks rotated to start at a random token (default: 0.5)")
    # fairseq's span distribution keeps P(k) up to the first below 1e-7: above -ln(1e-7) = 16.1 that is P(0)
    # alone (every span empty), and from ~100 P(0) underflows to 0 (torch: invalid multinomial distribution)
    poisson_lambda: float = setting(
        3.0,
        "mean span length of --mask-length span-poisson (default: 3.0)",
        type=float,
        metavar="L",
        bounds=Bounds(0, 16, lo_open=True),
    )
    permute_sentences: float = setting(
        -1.0,
        "share of the sentences of a block to shuffle; <= 0: none",
        type=float,
        metavar="P",
        bounds=Bounds(0, 1, off=-1),
    )
    mask_length: str = setting(
        "subword",
        "what one mask covers: a subword, a whole word, or a span of words of Poisson(--poisson-lambda) "
        "length (default: subword)",
        choices=MASK_LENGTHS,
    )
    replace_length: int = setting(
        0,
        "a masked span becomes 0 tokens (deleted), 1 <mask>, or -1: one <mask> per token (default: 0)",
        type=int,
        choices=(-1, 0, 1),
        bounds=Bounds(-1, 1),
    )
    shuffle_instance: float = _share(
        0.0, "non-zero: shuffle the blocks before sorting them by size into batches", metavar="X"
    )
    task: str = "denoising"
    seed: int = 1  # --seed (the noise draws from it)


@TASKS.register("denoising", config=DenoisingConfig)
class DenoisingTask(TranslationTask):
    """Rebuild token blocks of monolingual text from noised copies (BART's pretraining objective)."""

    def __init__(self, cfg: DenoisingConfig, dictionary: Dictionary, tokenizer_spec: dict | None = None):
        super().__init__(cfg, dictionary, dictionary, tokenizer_spec)
        self.dictionary = dictionary
        self.mask_idx = dictionary.index("<mask>")
        self._noise: Noise | None = None

    @classmethod
    def setup_task(cls, cfg: DenoisingConfig) -> DenoisingTask:
        check_noise_args(cfg)
        paths = cls._paths(cfg)
        path = os.path.join(paths[0], "dict.txt")
        if not os.path.exists(path):
            raise SeqtrainError(
                f"{path}: dictionary not found (--task denoising reads a monolingual data-bin: run "
                "seqtrain-preprocess --only-source)"
            )
        dictionary = Dictionary.load(path)
        dictionary.add_symbol("<mask>")  # as fairseq's denoising task: one more symbol, the last index
        logger.info(f"dictionary: {len(dictionary)} types")
        # the data-bin's tokenizer, checked against fairseq's --bpe flags where a command gives them
        return cls(cfg, dictionary, bpe_flags.databin_tokenizer(cfg.bpe, paths[0]).spec())

    def dictionary_file(self, side: str) -> str:
        """The one dict.txt of the monolingual data-bin, for both sides (the messages named dict.None.txt)."""
        return os.path.join(self._paths(self.cfg)[0], "dict.txt")

    # ---------------------------------------------------------------------------------------------- data
    def noise(self) -> Noise:
        """The noise of this run's flags (built once: the word-start table reads the whole dictionary)."""
        if self._noise is None:
            a, d = self.cfg, self.dictionary
            tokenizer = build_tokenizer(self.tokenizer_spec or {"kind": "none"})
            self._noise = Noise(
                mask_idx=self.mask_idx,
                vocab_size=len(d),
                mask=a.mask,
                mask_random=a.mask_random,
                insert=a.insert,
                permute=a.permute,
                rotate=a.rotate,
                permute_sentences=a.permute_sentences,
                replace_length=a.replace_length,
                mask_length=a.mask_length,
                poisson_lambda=a.poisson_lambda,
                full_stop=full_stop_index(d, tokenizer),
                word_starts=None if a.mask_length == "subword" else word_start_table(d, tokenizer),
            )
        return self._noise

    def load_dataset(self, split: str, epoch: int = 1, **_: Any) -> DenoisingDataset:
        """Open `split` ({split}.bin/.idx), cut it into blocks and keep its DenoisingDataset in self.datasets.
        Validation splits get the noise of epoch 1 at every validation, so their losses compare."""
        a = self.cfg
        paths = self._paths(a)
        train = split == a.dataset.train_subset
        folder = paths[(epoch - 1) % len(paths)] if train else paths[0]
        prefix = os.path.join(folder, split)
        if not MMapIndexedDataset.exists(prefix):
            raise SeqtrainError(
                f"{folder}: split {split!r} not found (expected {split}.bin and {split}.idx, as "
                "seqtrain-preprocess --only-source writes them)"
            )
        lines = MMapIndexedDataset(prefix)
        if len(lines) == 0:
            raise SeqtrainError(f"{prefix}.idx: split {split!r} has no lines")
        check_token_ids(lines, len(self.dictionary) - 1, os.path.join(folder, "dict.txt"), full=a.check_data)
        blocks = TokenBlockDataset(
            lines,
            lines.sizes,
            a.tokens_per_sample - 2,  # room for <s> and </s>
            break_mode=a.sample_break_mode,
            strip=self.dictionary.eos(),
        )
        if len(blocks) == 0:
            raise SeqtrainError(
                f"{prefix}: no token block in split {split!r} (--sample-break-mode {a.sample_break_mode})"
            )
        dataset = DenoisingDataset(
            blocks,
            self.dictionary,
            self.noise(),
            seed=a.seed,
            shuffle=bool(a.shuffle_instance),
            fixed_epoch=None if train else 1,
        )
        logger.info(f"{folder} {split}: {len(lines)} lines, {len(dataset)} blocks")
        self.datasets[split] = dataset
        return dataset


def check_noise_args(cfg: DenoisingConfig) -> None:
    """The flag combinations fairseq's DenoisingDataset refuses with a ValueError (each flag's own range is
    checked as it is parsed: seqtrain.flag_bounds)."""
    if cfg.mask_length == "subword" and cfg.replace_length not in (0, 1):
        raise SeqtrainError("--mask-length subword needs --replace-length 0 or 1 (as in fairseq)")
