"""fairseq's `translation` task (alias `summarization`): source -> target pairs from a data-bin.

The task owns the dictionaries and the datasets of one data-bin, builds the model and criterion for them, and
defines one training / validation step. The data-bin layout is fairseq's: dict.{src}.txt, dict.{tgt}.txt and
{split}.{src}-{tgt}.{lang}.bin/.idx; `data` may list several data-bins separated by ':' (epoch k trains on the
((k-1) mod n)-th, as fairseq does for sharded corpora; validation always reads the first).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from seqtrain.checkpoint.load import load_model
from seqtrain.config import setting, settings
from seqtrain.criterions import CriterionConfig, build_criterion
from seqtrain.data.batching import batch_by_size, filter_by_size, resolve_max_positions
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.indexed_dataset import MMapIndexedDataset, check_token_ids
from seqtrain.data.iterators import EpochBatchIterator
from seqtrain.data.options import TrainDatasetConfig
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.errors import SeqtrainError
from seqtrain.models import BartConfig, build_model
from seqtrain.registry import TASKS
from seqtrain.tasks import bpe_flags
from seqtrain.tasks.bpe_flags import BpeConfig
from seqtrain.tasks.step import StepContext

logger = logging.getLogger(__name__)


def infer_language_pair(path: str) -> tuple[str | None, str | None]:
    """(src, tgt) from the names of the data files, e.g. train.source-target.source.idx -> (source, target)."""
    pair_re = re.compile(r"^[^.]+\.([^.-]+)-([^.-]+)\.([^.]+)\.idx$")
    found = []
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        m = pair_re.match(name)
        if m and m.group(3) in (m.group(1), m.group(2)):
            found.append((name.startswith("train."), m.group(1), m.group(2)))
    if not found:
        return None, None
    found.sort(reverse=True)  # train files first: they name the pair the model is trained on
    return found[0][1], found[0][2]


@dataclass
class PositionsConfig:
    """The model's longest source and target (BartConfig's flags, filled by the --arch preset)."""

    max_source_positions: int = 1024
    max_target_positions: int = 1024


@settings
class TranslationConfig:
    """Task (translation)

    The data-bin a translation or summarization task reads (the first docstring line is the group's title); the
    fields below DATA are no flags of the task's group: the groups it reads, nested (filled from the same flags)."""

    data: str | None = setting(
        None,
        "data-bin folder (or several, separated by ':', used one per epoch in turn)",
        flags="data",
        metavar="DATA",
    )
    task: str = "translation"  # --task: the registered name chosen
    dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)  # the languages, padding, splits
    positions: PositionsConfig = field(default_factory=PositionsConfig)
    bpe: BpeConfig = field(default_factory=BpeConfig)  # fairseq's --bpe flags, checked against the data-bin
    check_data: bool = False  # --check-data
    langs: str | None = None  # --langs (translation_from_pretrained_bart's)


TASKS.common = TranslationConfig  # what a --user-dir task registered without settings of its own reads


@TASKS.register("translation", "summarization", config=TranslationConfig)
class TranslationTask:
    """Translate a source sequence into a target sequence (summarization is the same task)."""

    def __init__(
        self,
        cfg: TranslationConfig,
        src_dict: Dictionary,
        tgt_dict: Dictionary,
        tokenizer_spec: dict | None = None,
    ):
        self.cfg = cfg
        self.src_dict = src_dict
        self.tgt_dict = tgt_dict
        self.tokenizer_spec = tokenizer_spec
        self.datasets: dict[str, LanguagePairDataset] = {}
        self._iterators: dict[int, EpochBatchIterator] = {}

    # fairseq's name, used by criteria and generation
    @property
    def target_dictionary(self) -> Dictionary:
        return self.tgt_dict

    @classmethod
    def setup_task(cls, cfg: TranslationConfig) -> TranslationTask:
        """The task of `cfg` (the languages it leaves unset inferred from the data-bin's file names, into it)."""
        paths = cls._paths(cfg)
        d = cfg.dataset
        if d.source_lang is None or d.target_lang is None:
            src, tgt = infer_language_pair(paths[0])
            if src is None:
                raise SeqtrainError(
                    f"{paths[0]}: no data files like train.SRC-TGT.SRC.idx found to infer the languages from; "
                    "pass --source-lang and --target-lang (or run seqtrain-preprocess)"
                )
            d.source_lang = d.source_lang or src
            d.target_lang = d.target_lang or tgt
        src_dict = cls._load_dictionary(os.path.join(paths[0], f"dict.{d.source_lang}.txt"))
        tgt_dict = cls._load_dictionary(os.path.join(paths[0], f"dict.{d.target_lang}.txt"))
        if (src_dict.pad(), src_dict.eos(), src_dict.unk()) != (
            tgt_dict.pad(),
            tgt_dict.eos(),
            tgt_dict.unk(),
        ):
            raise SeqtrainError(f"{paths[0]}: source and target dictionaries disagree on the special symbols")
        logger.info(f"[{d.source_lang}] dictionary: {len(src_dict)} types")
        logger.info(f"[{d.target_lang}] dictionary: {len(tgt_dict)} types")

        spec = bpe_flags.databin_tokenizer(cfg.bpe, paths[0]).spec()  # checked against --bpe flags if given
        return cls(cfg, src_dict, tgt_dict, spec)

    @staticmethod
    def _paths(cfg: TranslationConfig) -> list[str]:
        paths = [p for p in str(cfg.data).split(":") if p]
        if not paths:
            raise SeqtrainError("DATA: no data-bin folder given")
        for p in paths:
            if not os.path.isdir(p):
                raise SeqtrainError(
                    f"DATA {p}: not a folder (expected a data-bin made by seqtrain-preprocess)"
                )
        return paths

    @staticmethod
    def _load_dictionary(path: str) -> Dictionary:
        if not os.path.exists(path):
            raise SeqtrainError(
                f"{path}: dictionary not found (is this a data-bin from seqtrain-preprocess?)"
            )
        return Dictionary.load(path)

    # ---------------------------------------------------------------------------------------------- data
    def _prefix(self, folder: str, split: str, lang: str) -> str:
        src, tgt = self.cfg.dataset.source_lang, self.cfg.dataset.target_lang
        for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
            prefix = os.path.join(folder, f"{split}.{pair}.{lang}")
            if MMapIndexedDataset.exists(prefix):
                return prefix
        raise SeqtrainError(
            f"{folder}: split {split!r} not found (expected {split}.{src}-{tgt}.{lang}.bin and .idx)"
        )

    def load_dataset(self, split: str, epoch: int = 1, **_: Any) -> LanguagePairDataset:
        """Open `split` (memory-mapped; nothing is read until batches are built) and keep it in self.datasets."""
        paths = self._paths(self.cfg)
        a = self.cfg.dataset
        folder = paths[(epoch - 1) % len(paths)] if split == a.train_subset else paths[0]
        src_prefix = self._prefix(folder, split, a.source_lang)
        tgt_prefix = self._prefix(folder, split, a.target_lang)
        src, tgt = MMapIndexedDataset(src_prefix), MMapIndexedDataset(tgt_prefix)
        if len(src) == 0:
            raise SeqtrainError(f"{src_prefix}.idx: split {split!r} has no examples")
        if len(src) != len(tgt):
            raise SeqtrainError(
                f"{src_prefix}.idx has {len(src)} examples but {tgt_prefix}.idx has {len(tgt)}: "
                f"source and target of split {split!r} must be aligned (run seqtrain-preprocess "
                "again)"
            )
        full = self.cfg.check_data
        for ds, d, lang in ((src, self.src_dict, a.source_lang), (tgt, self.tgt_dict, a.target_lang)):
            check_token_ids(ds, len(d), os.path.join(folder, f"dict.{lang}.txt"), full=full)
        dataset = LanguagePairDataset(
            src,
            src.sizes,
            self.src_dict,
            tgt,
            tgt.sizes,
            self.tgt_dict,
            left_pad_source=bool(a.left_pad_source),
            left_pad_target=bool(a.left_pad_target),
            prepend_bos=bool(a.prepend_bos),
            truncate_source=bool(a.truncate_source),
            max_source_positions=int(self.cfg.positions.max_source_positions),
            max_target_positions=int(self.cfg.positions.max_target_positions),
            **self.sequence_tokens(),
        )
        logger.info(f"{folder} {split} {a.source_lang}-{a.target_lang} {len(dataset)} examples")
        self.datasets[split] = dataset
        return dataset

    def sequence_tokens(self) -> dict[str, int]:
        """Tokens this task adds around each pair, as LanguagePairDataset keywords: none (plain `tokens </s>`)."""
        return {}

    def generator_tokens(self) -> dict[str, int]:
        """The decoder's start and end tokens (SequenceGenerator's `bos`, `eos`): </s> for both, its default."""
        return {}

    def dataset(self, split: str) -> LanguagePairDataset:
        if split not in self.datasets:
            raise KeyError(f"dataset {split!r} is not loaded (call load_dataset first)")
        return self.datasets[split]

    def max_positions(self) -> tuple[int, int]:
        return (
            int(self.cfg.positions.max_source_positions),
            int(self.cfg.positions.max_target_positions),
        )

    def get_batch_iterator(
        self,
        dataset: LanguagePairDataset,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        max_positions: Any = None,
        ignore_invalid_inputs: bool = False,
        required_batch_size_multiple: int = 1,
        seed: int = 1,
        num_shards: int = 1,
        shard_id: int = 0,
        num_workers: int = 0,
        epoch: int = 1,
        data_buffer_size: int = 0,
        split: str = "train",
    ) -> EpochBatchIterator:
        """Length-bucketed batches of `dataset` in an EpochBatchIterator. The same dataset object gives the same
        iterator back (its batches are frozen; only the epoch order changes), as fairseq caches them.

        fairseq 0.12's batches: examples are ordered under `seed + 1` (fairseq: `seed` + the epoch its
        iterator is made in, 1 in an uninterrupted run; a run resumed in a later epoch gets the uninterrupted
        run's batches here, where fairseq's would differ), or `seed + epoch` when each epoch reads its own
        data-bin.
        The training split skips examples longer than `max_tokens`; other splits are not filtered by it, so
        such an example is an error there, as in fairseq."""
        cached = self._iterators.get(id(dataset))
        if cached is not None and cached.dataset is dataset:
            return cached
        train = split == self.cfg.dataset.train_subset
        per_epoch_data = len([p for p in str(self.cfg.data or "").split(":") if p]) > 1
        indices = dataset.ordered_indices(seed + (epoch if train and per_epoch_data else 1))
        limits = (max_positions, self.max_positions(), max_tokens if train else None)
        max_positions = resolve_max_positions(*limits)
        indices = filter_by_size(indices, dataset, max_positions, ignore_invalid_inputs, split=split)
        batches = batch_by_size(
            indices,
            dataset.num_tokens,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            required_batch_size_multiple=required_batch_size_multiple,
            split=split,
        )
        mult = int(required_batch_size_multiple or 1)
        if train and mult > 1 and batches and len(batches[-1]) % mult:
            # fairseq 0.12's data_utils.batch_by_size drops a last batch whose size is not a multiple of
            # --required-batch-size-multiple; training does the same to keep its batches. Validation keeps it
            # (fairseq would leave those examples out of the valid loss).
            logger.info(
                f"{split}: the last batch ({len(batches[-1])} examples) is left out of every epoch, as fairseq "
                f"does: its size is not a multiple of --required-batch-size-multiple {mult}"
            )
            batches = batches[:-1]
        itr = EpochBatchIterator(
            dataset,
            dataset.collater,
            batches,
            seed=seed,
            num_shards=num_shards,
            shard_id=shard_id,
            epoch=epoch,
            buffer_size=data_buffer_size,
            num_workers=num_workers,
        )
        self._iterators[id(dataset)] = itr
        return itr

    def close_iterators(self) -> None:
        """Stop the data-loading helpers (threads, worker processes) of every iterator this task made."""
        for itr in self._iterators.values():
            itr.close()

    # ---------------------------------------------------------------------------------------------- model
    def build_model(self, cfg: BartConfig) -> torch.nn.Module:
        """The model of `cfg` (the arch preset applied) for this task's dictionaries."""
        return build_model(cfg, self.src_dict, self.tgt_dict)

    def build_criterion(self, cfg: CriterionConfig) -> Any:
        """The criterion `cfg.criterion` of its settings (CRITERIONS.config(cfg.criterion))."""
        return build_criterion(cfg, self)

    def dictionary_file(self, side: str) -> str:
        """The file of the `side` ("source", "target") dictionary in the first data-bin: where the messages about
        this task's dictionaries point (dict.{lang}.txt; the denoising task's one dict.txt)."""
        d = self.cfg.dataset
        lang = d.source_lang if side == "source" else d.target_lang
        return os.path.join(str(self.cfg.data or "").split(":")[0], f"dict.{lang or side}.txt")

    def load_teacher(self, path: str) -> Any:
        """--teacher-path's model for distillation (seqtrain.criterions.distillation): criteria sit below the
        checkpoint readers, so the task loads it for them."""
        return load_model(path)

    # ---------------------------------------------------------------------------------------------- steps
    def train_step(
        self,
        sample: dict[str, Any],
        model: torch.nn.Module,
        criterion: Any,
        step: StepContext,
        update_num: int,
        ignore_grad: bool = False,
    ) -> tuple[torch.Tensor, Any, dict[str, Any]]:
        """Forward (under `step.autocast()`) and backward (`step.backward(loss)`, which applies the fp16 loss
        scale) on one batch of update `update_num`; returns (loss, sample_size, logging_output)."""
        if not model.training:
            model.train()
        with torch.autograd.profiler.record_function("forward"), step.autocast():
            loss, sample_size, logging_output = criterion(model, sample)
        if ignore_grad:
            loss = loss * 0  # a dummy batch: keep the graph (collectives still run) but contribute nothing
        with torch.autograd.profiler.record_function("backward"):
            step.backward(loss)
        return loss, sample_size, logging_output

    def valid_step(
        self, sample: dict[str, Any], model: torch.nn.Module, criterion: Any
    ) -> tuple[torch.Tensor, Any, dict[str, Any]]:
        model.eval()
        with torch.no_grad():
            return criterion(model, sample)

    def reduce_metrics(self, logging_outputs: list[dict[str, Any]], criterion: Any) -> dict[str, float]:
        return type(criterion).reduce_metrics(logging_outputs)
