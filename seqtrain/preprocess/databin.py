"""seqtrain-preprocess: raw parallel text -> tokenizer, fairseq dict.txt files, mmap binarized data-bin.

The steps are fairseq-preprocess's, streamed so memory does not grow with the number of lines:

1. validate every input file in one streaming pass: it exists, is UTF-8, has no empty line, and source and target
   have the same number of lines. Nothing is written before this passes.
2. tokenizer: train one sentencepiece model on the train source and target text together (BART-style; a shared
   model keeps copied words identical on both sides), or load `--spm-model`, GPT-2 BPE files, or `none`.
3. dictionaries: counted from the tokenized train text (per side, or joined), or loaded from --srcdict/--tgtdict.
4. binarize every split and side: each file is cut into byte ranges on line boundaries, each range becomes one
   shard (in worker processes with --workers N), and the shards are merged in file order. The result depends only
   on the input text, never on the worker count.
5. everything is written into a temporary folder inside --destdir and moved into place at the end, so an
   interrupted or failed run leaves no file that looks valid but is not; `preprocess.json` is moved last.

Why one module: the five steps above share one streaming plan (byte ranges, shards, the temporary
folder) and are read top to bottom as fairseq-preprocess's counterpart.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import filecmp
import functools
import json
import math
import multiprocessing
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from seqtrain import fileio
from seqtrain.config import from_args
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype
from seqtrain.data.tokenizer import (
    SentencePieceTokenizer,
    Tokenizer,
    TokenizerConfig,
    build_tokenizer,
    load_tokenizer,
    save_databin_tokenizer,
)
from seqtrain.errors import SeqtrainError, Stopped
from seqtrain.fileio import MAX_LINE_BYTES, atomic_write, bounded_lines, line_too_long
from seqtrain.preprocess import jsonl as preprocess_jsonl
from seqtrain.preprocess import tables as preprocess_tables
from seqtrain.preprocess.options import PreprocessConfig
from seqtrain.preprocess.scratch import signals_deferred, work_folder
from seqtrain.workers import child_pool

PERCENTILES = (50, 90, 95, 99)
# Each file is cut into at least 4 ranges per worker (load balance) and ranges of at most 16 MiB (progress updates).
_CHUNKS_PER_WORKER = 4
_MAX_CHUNK_BYTES = 16 << 20
_READ_BLOCK = 1 << 20
# A line holding only whitespace (not newlines) or invisible format characters (zero-width spaces and joiners,
# word joiners, BOMs, soft hyphens) followed by its newline: an empty example.
_BLANK_LINE = re.compile(r"^(?:[^\S\n]|[\u00ad\u200b-\u200f\u2060-\u2064\ufeff])*\n", re.MULTILINE)


@dataclass
class PreprocessRun:
    """seqtrain-preprocess's settings, read once from its parsed flags (preprocess)."""

    data: PreprocessConfig = field(default_factory=PreprocessConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def values(self) -> dict[str, Any]:
        """Every setting by flag dest: what preprocess.json records as "args" (and a rerun compares)."""
        return {**dataclasses.asdict(self.data), **dataclasses.asdict(self.tokenizer)}


# ----------------------------------------------------------------------------------------------------------------
# inputs


@dataclass
class SplitInput:
    """One split to binarize: its output name, the input prefix and the flag it came from."""

    name: str  # train, valid, valid1, test, ...
    prefix: str
    flag: str
    paths: dict[str, str] = field(default_factory=dict)  # lang -> input file
    n_lines: int = 0
    jsonl_path: str = (  # with --jsonl: PREFIX.jsonl, whose values become `paths` (seqtrain.preprocess.jsonl);
        ""  # with --parquet PREFIX.parquet, with --load-from-disk the folder PREFIX (seqtrain.preprocess.tables)
    )


def resolve_languages(cfg: PreprocessRun) -> None:
    """fairseq-preprocess's names: a pair is source/target unless -s/-t say otherwise; --only-source without -s
    has no language at all (input PREFIX, output {split}.bin/.idx and dict.txt, what fairseq's denoising and
    language-model tasks read)."""
    if not cfg.data.only_source:
        cfg.data.source_lang = cfg.data.source_lang or "source"
        cfg.data.target_lang = cfg.data.target_lang or "target"


def dict_file(lang: str | None) -> str:
    """fairseq-preprocess's dictionary name: dict.{lang}.txt, or dict.txt for a side without a language."""
    return "dict.txt" if lang is None else f"dict.{lang}.txt"


def side_name(lang: str | None) -> str:
    """The side's key in preprocess.json and the printed table ('source' for --only-source without -s)."""
    return "source" if lang is None else lang


def data_prefix(cfg: PreprocessRun, split: str, lang: str | None) -> str:
    """fairseq-preprocess's dataset name (dataset_dest_prefix): {split}.{src}-{tgt}.{lang}, or {split} alone
    for --only-source without a language. (With --only-source and -s X, fairseq writes {split}.X-None.X.)"""
    if lang is None:
        return split
    return f"{split}.{cfg.data.source_lang}-{cfg.data.target_lang}.{lang}"


def check_settings(cfg: PreprocessRun) -> None:
    """Flag combinations that cannot work, reported before any file is read."""
    resolve_languages(cfg)
    if not (cfg.data.trainpref or cfg.data.validpref or cfg.data.testpref):
        raise SeqtrainError("nothing to preprocess: give --trainpref, --validpref and/or --testpref")
    fmt = preprocess_jsonl.input_format(cfg.data)
    if (cfg.data.source_key or cfg.data.target_key) and not fmt:
        raise SeqtrainError(
            "--source-key / --target-key need --jsonl, --parquet or --load-from-disk (they name keys or columns "
            "of those inputs)"
        )
    if fmt and cfg.data.only_source and not (cfg.data.source_key or cfg.data.source_lang):
        raise SeqtrainError(
            f"{preprocess_jsonl.FORMATS[fmt]} --only-source: name the key holding the text with --source-key"
        )
    if cfg.data.workers < 1:
        raise SeqtrainError(f"--workers must be at least 1, got {cfg.data.workers}")
    if cfg.data.padding_factor < 1:
        raise SeqtrainError(f"--padding-factor must be at least 1, got {cfg.data.padding_factor}")
    if not cfg.data.only_source and cfg.data.source_lang == cfg.data.target_lang:
        raise SeqtrainError(
            f"--source-lang and --target-lang are both {cfg.data.source_lang!r}; their files would collide"
        )
    if cfg.data.joined_dictionary and cfg.data.srcdict and cfg.data.tgtdict:
        raise SeqtrainError("cannot use both --srcdict and --tgtdict with --joined-dictionary")
    given_dict = cfg.data.srcdict or (cfg.data.tgtdict and not cfg.data.only_source)
    if cfg.tokenizer.tokenizer == "sentencepiece" and not cfg.tokenizer.spm_model:
        if given_dict:
            raise SeqtrainError(
                "--srcdict/--tgtdict with a newly trained sentencepiece model: the dictionary cannot match the new "
                "pieces; pass the --spm-model it was made with, or --tokenizer none for already tokenized text"
            )
        if not cfg.data.trainpref:
            raise SeqtrainError(
                "--trainpref is needed to train the sentencepiece model (or give --spm-model)"
            )
        if cfg.tokenizer.spm_vocab_size < 2:
            raise SeqtrainError(f"--spm-vocab-size must be at least 2, got {cfg.tokenizer.spm_vocab_size}")
        if cfg.tokenizer.spm_num_threads < 1:
            raise SeqtrainError(f"--spm-num-threads must be at least 1, got {cfg.tokenizer.spm_num_threads}")
    if cfg.tokenizer.tokenizer == "gpt2" and not (
        cfg.tokenizer.gpt2_encoder_json and cfg.tokenizer.gpt2_vocab_bpe
    ):
        raise SeqtrainError(
            "--tokenizer gpt2 needs --gpt2-encoder-json and --gpt2-vocab-bpe (GPT-2's encoder.json, vocab.bpe)"
        )
    if not cfg.data.trainpref:
        if not cfg.data.srcdict:
            raise SeqtrainError("--trainpref is needed to build the source dictionary (or give --srcdict)")
        if not cfg.data.only_source and not cfg.data.tgtdict and not cfg.data.joined_dictionary:
            raise SeqtrainError("--trainpref is needed to build the target dictionary (or give --tgtdict)")
    for flag, path in (
        ("--srcdict", cfg.data.srcdict),
        ("--tgtdict", cfg.data.tgtdict),
        ("--spm-model", cfg.tokenizer.spm_model),
        ("--gpt2-encoder-json", cfg.tokenizer.gpt2_encoder_json),
        ("--gpt2-vocab-bpe", cfg.tokenizer.gpt2_vocab_bpe),
    ):
        if path and not os.path.isfile(path):
            raise SeqtrainError(f"{flag}: file not found: {path}")


def languages(cfg: PreprocessRun) -> list[str | None]:
    return [cfg.data.source_lang] if cfg.data.only_source else [cfg.data.source_lang, cfg.data.target_lang]


def collect_inputs(cfg: PreprocessRun) -> list[SplitInput]:
    """The splits fairseq-preprocess would write: train, then valid, valid1, ..., then test, test1, ..."""
    splits = []
    if cfg.data.trainpref:
        splits.append(SplitInput("train", cfg.data.trainpref, "--trainpref"))
    for flag, base, value in (
        ("--validpref", "valid", cfg.data.validpref),
        ("--testpref", "test", cfg.data.testpref),
    ):
        if value:
            for k, prefix in enumerate(value.split(",")):
                splits.append(SplitInput(f"{base}{k}" if k else base, prefix, flag))
    for s in splits:
        for lang in languages(cfg):
            s.paths[lang] = s.prefix if lang is None else f"{s.prefix}.{lang}"
        fmt = preprocess_jsonl.input_format(cfg.data)
        if fmt == "jsonl":
            s.jsonl_path = f"{s.prefix}.jsonl"
        elif fmt:
            s.jsonl_path = preprocess_tables.input_path(fmt, s.prefix)
    return splits


def validate_inputs(cfg: PreprocessRun, splits: list[SplitInput]) -> None:
    """Every file exists, is valid UTF-8, has no empty line; source and target line counts agree. (JSON lines
    inputs are checked as they are read, by seqtrain.preprocess.jsonl.)"""
    fmt = preprocess_jsonl.input_format(cfg.data)
    if fmt == "jsonl":
        for s in splits:
            if not os.path.isfile(s.jsonl_path):
                raise SeqtrainError(f"{s.flag} {s.prefix}: input file not found: {s.jsonl_path}")
        return
    if fmt:
        for s in splits:
            preprocess_tables.check_exists(fmt, s.flag, s.prefix)
        return
    for s in splits:
        for path in s.paths.values():
            if not os.path.isfile(path):
                raise SeqtrainError(f"{s.flag} {s.prefix}: input file not found: {path}")
    for s in splits:
        counts = {lang: scan_text_file(path, cfg.data.only_source) for lang, path in s.paths.items()}
        if len(set(counts.values())) > 1:
            (a, na), (b, nb) = list(counts.items())
            raise SeqtrainError(
                f"line count mismatch: {s.paths[a]} has {na} lines but {s.paths[b]} has {nb} "
                "(line i of each must belong together)"
            )
        s.n_lines = next(iter(counts.values()))


def scan_text_file(path: str, allow_blank: bool = False) -> int:
    """Stream one input file and return its number of lines; raise naming file:line on bad UTF-8 or an empty line
    (unless `allow_blank`: monolingual text, where a blank line ends a document, as fairseq-preprocess keeps it)."""
    n = 0
    carry = b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_READ_BLOCK)
            if not block:
                break
            buf = carry + block
            cut = buf.rfind(b"\n") + 1  # check whole lines only; a UTF-8 sequence never spans a newline byte
            carry = buf[cut:]
            if cut:
                n = _check_lines(path, buf[:cut], n, allow_blank)
            if len(carry) > MAX_LINE_BYTES:  # seqtrain.fileio's bound: a file without line ends is no text
                raise line_too_long(path, n + 1)
    if carry:
        n = _check_lines(path, carry + b"\n", n, allow_blank)
    if n == 0:
        raise SeqtrainError(f"{path}: file is empty")
    return n


def _check_lines(path: str, buf: bytes, lines_before: int, allow_blank: bool = False) -> int:
    try:
        text = buf.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + buf.count(b"\n", 0, e.start) + 1
        column = e.start - (buf.rfind(b"\n", 0, e.start) + 1) + 1
        raise SeqtrainError(
            f"{path}:{line}: invalid UTF-8 (byte 0x{buf[e.start]:02x} at byte {column} of the line)"
        ) from None
    blank = None if allow_blank else _BLANK_LINE.search(text)
    if blank:
        line = lines_before + text.count("\n", 0, blank.start()) + 1
        raise SeqtrainError(
            f"{path}:{line}: empty line (only whitespace or zero-width characters; every example needs text; "
            "remove the pair from both sides)"
        )
    return lines_before + text.count("\n")


def _line_number(path: str, start: int, index: int) -> int:
    """The 1-based number of the `index`-th line of the range that begins at byte `start` (error path only)."""
    with open(path, "rb") as f:
        return f.read(start).count(b"\n") + index + 1


def line_chunks(path: str, n_chunks: int) -> list[tuple[int, int]]:
    """Cut a file into about n_chunks byte ranges that start and end on line boundaries (none empty)."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as f:
        for i in range(1, n_chunks):
            f.seek(size * i // n_chunks)
            f.readline(MAX_LINE_BYTES + 1)  # move to the start of the next line (validated: within the bound)
            pos = min(f.tell(), size)
            if pos > bounds[-1]:
                bounds.append(pos)
    if size > bounds[-1]:
        bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:]))


def _chunk_count(path: str, workers: int) -> int:
    size = os.path.getsize(path)
    return max(_CHUNKS_PER_WORKER * workers, math.ceil(size / _MAX_CHUNK_BYTES))


def read_chunk(path: str, start: int, end: int) -> Iterator[str]:
    """The lines (without line ending) in bytes [start, end) of an already validated file (scan_text_file);
    read with seqtrain.fileio's bound on a line's length all the same."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for raw in bounded_lines(f, path):
            if pos >= end:
                break
            pos += len(raw)
            yield raw.decode("utf-8").rstrip("\r\n")


# ----------------------------------------------------------------------------------------------------------------
# work on chunks, in this process or in a pool


@dataclass
class ChunkStats:
    """What binarizing one range (or, merged, one file) found. `lengths`: histogram of item lengths."""

    examples: int = 0
    tokens: int = 0
    unk: int = 0
    max_id: int = -1
    lengths: Counter = field(default_factory=Counter)

    def add(self, other: ChunkStats) -> None:
        self.max_id = max(self.max_id, other.max_id)
        self.examples += other.examples
        self.tokens += other.tokens
        self.unk += other.unk
        self.lengths.update(other.lengths)


class ChunkWorker:
    """The tokenizer and dictionaries a worker needs, rebuilt from plain data so any process start method works."""

    def __init__(self, tokenizer_spec: dict[str, Any], dict_lists: dict[str, list] | None = None):
        self.tokenizer = build_tokenizer(tokenizer_spec)
        self.dicts = {lang: Dictionary.from_list(lst) for lang, lst in (dict_lists or {}).items()}

    def count(self, path: str, start: int, end: int) -> Counter:
        """Symbol counts of the tokenized lines of a range."""
        counts: Counter = Counter()
        for line in read_chunk(path, start, end):
            counts.update(self.tokenizer.encode(line).split())
        return counts

    def binarize(
        self,
        path: str,
        start: int,
        end: int,
        lang: str,
        out_prefix: str,
        shown: tuple[str, str] | None = None,
        allow_empty: bool = False,
    ) -> ChunkStats:
        """Tokenize and encode a range into the shard `out_prefix.{bin,idx}`. `shown`: the input file and the
        thing an error names (--jsonl: PREFIX.jsonl and its value, whose line numbers `path`'s are), when
        `path` itself is no file of the user's. `allow_empty`: a line that tokenizes to nothing becomes the item
        `</s>`, fairseq's document break (--only-source), instead of an error."""
        d = self.dicts[lang]
        unk = d.unk()
        stats = ChunkStats()
        with MMapIndexedDatasetBuilder(out_prefix + ".bin", best_fitting_dtype(len(d))) as builder:
            for i, line in enumerate(read_chunk(path, start, end)):
                ids = d.encode_line(self.tokenizer.encode(line), add_if_not_exist=False, append_eos=True)
                if len(ids) <= 1 and not allow_empty:  # only </s>: the tokenizer kept nothing of this line
                    name, what = shown or (path, "the line")
                    raise SeqtrainError(
                        f"{name}:{_line_number(path, start, i)}: {what} tokenizes to nothing (no token "
                        f"besides </s>): an empty example; remove the pair from both sides"
                    )
                builder.add_item(ids)
                stats.examples += 1
                stats.tokens += len(ids)
                stats.unk += int((ids == unk).sum())
                stats.max_id = max(stats.max_id, int(ids.max()))
                stats.lengths[len(ids)] += 1
            builder.finalize(out_prefix + ".idx")
        return stats


_WORKER: ChunkWorker | None = None  # set once per pool process by _init_worker


def _init_worker(tokenizer_spec: dict[str, Any], dict_lists: dict[str, list] | None) -> None:
    global _WORKER
    _WORKER = ChunkWorker(tokenizer_spec, dict_lists)


def _run_task(task: tuple[str, tuple]) -> Any:
    method, task_args = task
    return getattr(_WORKER, method)(*task_args)


def run_tasks(
    method: str,
    tasks: list[tuple],
    line_counts: list[int],
    workers: int,
    tokenizer_spec: dict[str, Any],
    dict_lists: dict[str, list] | None,
    desc: str,
    no_progress_bar: bool,
) -> list[Any]:
    """Run `ChunkWorker.<method>(*task)` for every task, results in task order, with a progress bar over lines."""
    pool = None
    if workers > 1 and len(tasks) > 1:
        # fork is cheap and shares the loaded modules; elsewhere spawn works too (the state is plain data).
        # The pool starts before the progress bar, so no bar thread exists when the workers fork.
        # The workers ignore SIGTERM and SIGINT (the work folder's handler in this process ends the run) and
        # are ended by SIGKILL when the pool is terminated.
        start = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = child_pool(min(workers, len(tasks)), _init_worker, (tokenizer_spec, dict_lists), start)
    results = []
    try:
        with tqdm(
            total=sum(line_counts),
            desc=desc,
            unit=" lines",
            disable=True if no_progress_bar else None,
            leave=False,
        ) as bar:
            if pool is None:
                worker = ChunkWorker(tokenizer_spec, dict_lists)
                outputs = (getattr(worker, method)(*task) for task in tasks)
            else:
                outputs = pool.imap(_run_task, [(method, task) for task in tasks])
            for result, n in zip(outputs, line_counts):
                results.append(result)
                bar.update(n)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return results


def _line_counts_of(path: str, chunks: list[tuple[int, int]], n_lines: int) -> list[int]:
    """Lines per chunk for the progress bar, estimated from bytes (exact counts are not needed there)."""
    size = max(1, os.path.getsize(path))
    est = [round(n_lines * (b - a) / size) for a, b in chunks]
    est[-1] += n_lines - sum(est)
    return est


# ----------------------------------------------------------------------------------------------------------------
# the run


def preprocess(args: argparse.Namespace) -> dict[str, Any]:
    """Run all steps with seqtrain-preprocess's parsed flags; return the summary also written to
    `preprocess.json`."""
    cfg = from_args(PreprocessRun, args)  # the program's one read of its flags
    check_settings(cfg)
    splits = collect_inputs(cfg)
    validate_inputs(cfg, splits)
    inputs = read_files(cfg, splits)
    train = next((s for s in splits if s.name == "train"), None)

    destdir = cfg.data.destdir
    check_rerun_flags(cfg)  # before the tokenizer is trained: that takes a minute on real data
    created = not os.path.isdir(destdir)
    try:
        os.makedirs(destdir, exist_ok=True)
    except OSError as e:
        raise SeqtrainError(f"--destdir {destdir}: cannot create the folder ({e.strerror})") from None
    # in destdir (same filesystem: the final moves are renames); removed at the end, also on SIGTERM, and
    # left-overs of killed runs are removed first
    cleanup = contextlib.ExitStack()
    ok = False
    try:  # (the work folder entered inside: a signal while it is made gets the line below and the clean-up)
        work = cleanup.enter_context(work_folder(destdir, "preprocess"))
        fmt = preprocess_jsonl.input_format(cfg.data)
        if fmt == "jsonl":
            preprocess_jsonl.extract_splits(cfg.data, splits, languages(cfg), work)
        elif fmt:
            read = functools.partial(preprocess_tables.extract, fmt)
            preprocess_jsonl.extract_splits(cfg.data, splits, languages(cfg), work, read)
        spec = make_tokenizer(cfg, train, work).spec()
        dicts = make_dictionaries(cfg, spec, train)
        for lang, d in dicts.items():
            d.save(os.path.join(work, dict_file(lang)))
            print(f"[{side_name(lang)}] Dictionary: {len(d)} types")
        check_existing_dictionaries(destdir, work, list(dicts))
        summary = {
            "format": "seqtrain-preprocess",
            "version": 1,
            "source_lang": cfg.data.source_lang,
            "target_lang": None if cfg.data.only_source else cfg.data.target_lang,
            "tokenizer": spec.get("kind", cfg.tokenizer.tokenizer),
            "dictionaries": {
                side_name(lang): {"file": dict_file(lang), "size": len(d)} for lang, d in dicts.items()
            },
            "splits": {},
            "args": {k: v for k, v in sorted(cfg.values().items())},
        }
        if not cfg.data.dict_only:
            summary["splits"] = binarize_splits(cfg, splits, spec, dicts, work)
        with atomic_write(os.path.join(work, "preprocess.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
        with signals_deferred():  # no half data-bin: a SIGTERM / Ctrl-C now acts once every file is in place
            publish(work, destdir, inputs)
            ok = True
    except Stopped as e:
        kept = f"the data-bin in {destdir} is whole" if ok else f"nothing was written to --destdir {destdir}"
        e.message = f"{e.message}; {kept} (exit code {e.code})"
        raise
    finally:
        cleanup.close()
        if not ok and created:
            with contextlib.suppress(OSError):
                os.rmdir(destdir)  # only succeeds if nothing else was put there
    print(format_summary(summary, destdir))
    return summary


def read_files(cfg: PreprocessRun, splits: list[SplitInput]) -> list[tuple[str, str | None]]:
    """The files preprocessing reads, as (flag, path) for seqtrain.fileio.check_outputs_apart."""
    inputs = [(s.flag, path) for s in splits for path in [*s.paths.values(), s.jsonl_path]]
    inputs += [("--srcdict", cfg.data.srcdict), ("--tgtdict", cfg.data.tgtdict)]
    tok = cfg.tokenizer
    return inputs + [(f"--{k.replace('_', '-')}", getattr(tok, k)) for k in ("spm_model", "gpt2_encoder_json",
                                                                             "gpt2_vocab_bpe")]  # fmt: skip


def publish(work: str, destdir: str, inputs: list[tuple[str, str | None]] = ()) -> None:
    """Move the finished files into destdir, each by seqtrain.fileio's rule for outputs (renamed over a regular
    file, written through a link, into a FIFO...); preprocess.json last, so its presence means the rest is
    complete. None replaces one of the `inputs` with other bytes (seqtrain.fileio.check_outputs_apart; the
    same bytes lose nothing: --srcdict bin/dict.src.txt --destdir bin, adding a split to a data-bin)."""
    names = sorted(
        n for n in os.listdir(work) if os.path.isfile(os.path.join(work, n)) and not n.startswith(".")
    )
    names.sort(key=lambda n: n == "preprocess.json")
    for name in names:
        try:
            fileio.check_outputs_apart([("--destdir", os.path.join(destdir, name))], inputs)
        except SeqtrainError:
            if not filecmp.cmp(os.path.join(work, name), os.path.join(destdir, name), shallow=False):
                raise
    for name in names:
        fileio.output_target(os.path.join(destdir, name))  # a folder in the way: refused before any move
    for name in names:
        fileio.publish(os.path.join(work, name), os.path.join(destdir, name))


# the flags that decide the tokenizer and the dictionaries: a data-bin made with other values cannot be mixed with
# the new one. (--trainpref only counts when the dictionaries are built from it.)
DICTIONARY_FLAGS = (
    "tokenizer",
    "spm_model",
    "spm_vocab_size",
    "spm_model_type",
    "spm_character_coverage",
    "gpt2_encoder_json",
    "gpt2_vocab_bpe",
    "joined_dictionary",
    "srcdict",
    "tgtdict",
    "nwordssrc",
    "nwordstgt",
    "thresholdsrc",
    "thresholdtgt",
    "padding_factor",
    "source_lang",
    "target_lang",
    "only_source",
)


def check_rerun_flags(cfg: PreprocessRun) -> None:
    """A rerun into a --destdir that holds a data-bin made with other tokenizer or dictionary flags would fail
    at the end (check_existing_dictionaries) after retraining the tokenizer; say so at once, naming the flags."""
    try:
        with open(os.path.join(cfg.data.destdir, "preprocess.json"), encoding="utf-8") as f:
            before = json.load(f).get("args")
    except (OSError, ValueError, AttributeError):
        return  # no data-bin there (or not one of seqtrain's): nothing to compare with
    if not isinstance(before, dict):
        return
    keys = list(DICTIONARY_FLAGS)
    if not cfg.data.srcdict and not cfg.data.tgtdict:
        keys.append("trainpref")
    now = cfg.values()
    changed = []
    for key in keys:
        if key not in before or before[key] == now.get(key):
            continue
        flag = "--" + key.replace("_", "-")
        old, new = before[key], now.get(key)
        if isinstance(new, bool) or isinstance(old, bool):
            changed.append(f"{flag} {'given now, not before' if new else 'given before, not now'}")
        else:
            changed.append(f"{flag} {old} before, {new} now")
    if changed:
        raise SeqtrainError(
            f"--destdir {cfg.data.destdir} holds a data-bin made with other tokenizer/dictionary flags "
            f"({'; '.join(changed)}): its files cannot be mixed with the new ones. Remove that folder or choose "
            "another --destdir, then rerun (nothing was changed)"
        )


def check_existing_dictionaries(destdir: str, work: str, langs: list[str | None]) -> None:
    """Refuse to mix data-bins: an existing dict.{lang}.txt must equal the new one (identical is fine)."""
    for lang in langs:
        old = os.path.join(destdir, dict_file(lang))
        if not os.path.exists(old):
            continue
        with open(old, "rb") as f_old, open(os.path.join(work, dict_file(lang)), "rb") as f_new:
            if f_old.read() != f_new.read():
                raise SeqtrainError(
                    f"{old} already exists and differs from the dictionary built now; "
                    f"use another --destdir or remove the old data-bin"
                )


# ----------------------------------------------------------------------------------------------------------------
# tokenizer


def make_tokenizer(cfg: PreprocessRun, train: SplitInput | None, work: str) -> Tokenizer:
    """Train or load the tokenizer and write tokenizer.json (+ model file copies) into the work folder."""
    if cfg.tokenizer.tokenizer == "sentencepiece" and not cfg.tokenizer.spm_model:
        tokenizer = train_sentencepiece(cfg, [train.paths[lang] for lang in languages(cfg)], train.n_lines)
    else:
        tokenizer = load_tokenizer(cfg.tokenizer)
    save_databin_tokenizer(work, tokenizer)
    return tokenizer


def train_sentencepiece(cfg: PreprocessRun, files: list[str], n_lines: int) -> Tokenizer:
    """One model for all `files` (train source and target): BART-style, copied words get the same pieces.

    Reproducible: a fixed thread count (--spm-num-threads, never --workers) and our own even sampling of at most
    --spm-input-sentence-size lines (sentencepiece's own sampling is random on every run, even with a seed).
    """
    tok = cfg.tokenizer
    total = n_lines * len(files)
    keep = total if tok.spm_input_sentence_size <= 0 else min(total, tok.spm_input_sentence_size)

    def sentences() -> Iterator[str]:
        i = 0
        for path in files:
            for line in read_chunk(path, 0, os.path.getsize(path)):
                if (i * keep) // total != (
                    (i + 1) * keep
                ) // total:  # exactly `keep` of `total`, evenly spread
                    yield line
                i += 1

    print(
        f"training sentencepiece ({tok.spm_model_type}, vocab {tok.spm_vocab_size}) on {keep:,} lines of "
        f"{', '.join(files)}",
        flush=True,
    )
    return SentencePieceTokenizer.train_iter(
        sentences(),
        vocab_size=tok.spm_vocab_size,
        model_type=tok.spm_model_type,
        character_coverage=tok.spm_character_coverage,
        num_threads=tok.spm_num_threads,
        verbose=cfg.data.debug,
        what=f"--spm-vocab-size {tok.spm_vocab_size}: sentencepiece training",
    )


# ----------------------------------------------------------------------------------------------------------------
# dictionaries


def make_dictionaries(
    cfg: PreprocessRun, tokenizer_spec: dict[str, Any], train: SplitInput | None
) -> dict[str, Dictionary]:
    """fairseq-preprocess's rules: given dictionaries are used as they are; built ones are finalized."""
    src, tgt = cfg.data.source_lang, cfg.data.target_lang
    langs = languages(cfg)
    if cfg.data.joined_dictionary:
        given = cfg.data.srcdict or cfg.data.tgtdict
        d = (
            Dictionary.load(given)
            if given
            else build_dictionary(
                cfg, tokenizer_spec, train, langs, cfg.data.thresholdsrc, cfg.data.nwordssrc
            )
        )
        return {lang: d for lang in langs}
    dicts = {
        src: Dictionary.load(cfg.data.srcdict)
        if cfg.data.srcdict
        else build_dictionary(cfg, tokenizer_spec, train, [src], cfg.data.thresholdsrc, cfg.data.nwordssrc)
    }
    if not cfg.data.only_source:
        dicts[tgt] = (
            Dictionary.load(cfg.data.tgtdict)
            if cfg.data.tgtdict
            else build_dictionary(
                cfg, tokenizer_spec, train, [tgt], cfg.data.thresholdtgt, cfg.data.nwordstgt
            )
        )
    return dicts


def build_dictionary(
    cfg: PreprocessRun,
    tokenizer_spec: dict[str, Any],
    train: SplitInput,
    langs: list[str | None],
    threshold: int,
    nwords: int,
) -> Dictionary:
    """Count the tokenized train text of `langs` (one `</s>` per line, as fairseq) and finalize."""
    tasks, line_counts = [], []
    for lang in langs:
        path = train.paths[lang]
        chunks = line_chunks(path, _chunk_count(path, cfg.data.workers))
        tasks += [(path, a, b) for a, b in chunks]
        line_counts += _line_counts_of(path, chunks, train.n_lines)
    total: Counter = Counter()
    for counts in run_tasks(
        "count",
        tasks,
        line_counts,
        cfg.data.workers,
        tokenizer_spec,
        None,
        f"count {'+'.join(map(side_name, langs))}",
        cfg.data.no_progress_bar,
    ):
        total.update(counts)
    d = Dictionary()
    total[d.eos_word] += train.n_lines * len(langs)
    d.add_counts(total)
    d.finalize(threshold=threshold, nwords=nwords, padding_factor=cfg.data.padding_factor)
    return d


# ----------------------------------------------------------------------------------------------------------------
# binarization


def binarize_splits(
    cfg: PreprocessRun,
    splits: list[SplitInput],
    tokenizer_spec: dict[str, Any],
    dicts: dict[str, Dictionary],
    work: str,
) -> dict[str, dict[str, Any]]:
    """Binarize every split and side in one pool (small valid/test files fill idle workers); merge shards in order."""
    shard_dir = os.path.join(work, ".shards")
    os.makedirs(shard_dir)
    jobs = []  # (split, lang, output prefix, shard prefixes)
    tasks, line_counts = [], []
    json_keys = (
        preprocess_jsonl.keys(cfg.data, languages(cfg)) if preprocess_jsonl.input_format(cfg.data) else {}
    )
    for s in splits:
        for lang, path in s.paths.items():
            chunks = line_chunks(path, _chunk_count(path, cfg.data.workers))
            shards = [
                os.path.join(shard_dir, f"{s.name}.{side_name(lang)}.{i:05d}") for i in range(len(chunks))
            ]
            # --jsonl: errors name PREFIX.jsonl (same line numbers), not the line file made from it in `work`
            shown = (s.jsonl_path, f"its {json_keys[lang]!r} value") if s.jsonl_path else None
            tasks += [
                (path, a, b, lang, shard, shown, cfg.data.only_source)
                for (a, b), shard in zip(chunks, shards)
            ]
            line_counts += _line_counts_of(path, chunks, s.n_lines)
            prefix = os.path.join(work, data_prefix(cfg, s.name, lang))
            jobs.append((s, lang, prefix, shards))
    dict_lists = {lang: d.to_list() for lang, d in dicts.items()}
    results = iter(
        run_tasks(
            "binarize",
            tasks,
            line_counts,
            cfg.data.workers,
            tokenizer_spec,
            dict_lists,
            "binarize",
            cfg.data.no_progress_bar,
        )
    )

    report: dict[str, dict[str, Any]] = {}
    for s, lang, prefix, shards in jobs:
        stats = ChunkStats()
        with MMapIndexedDatasetBuilder(prefix + ".bin", best_fitting_dtype(len(dicts[lang]))) as builder:
            for shard in shards:
                stats.add(next(results))
                builder.merge_file_(shard)
                os.unlink(shard + ".bin")
                os.unlink(shard + ".idx")
            builder.finalize(prefix + ".idx")
        report.setdefault(s.name, {})[side_name(lang)] = split_report(s.jsonl_path or s.paths[lang], stats)
    os.rmdir(shard_dir)
    return report


def split_report(path: str, stats: ChunkStats) -> dict[str, Any]:
    """Figures of one binarized file. Tokens and lengths count the `</s>` each item ends with, as fairseq does."""
    return {
        "input": path,
        "examples": stats.examples,
        "tokens": stats.tokens,
        "unk": stats.unk,
        "max_id": stats.max_id,  # checked against the dictionary when the split is opened
        "unk_rate": stats.unk / stats.tokens if stats.tokens else 0.0,
        "length": length_percentiles(stats.lengths),
    }


def length_percentiles(hist: Counter, qs: Sequence[int] = PERCENTILES) -> dict[str, int]:
    """Nearest-rank percentiles from a histogram: the smallest length with at least q% of items at or below it."""
    total = sum(hist.values())
    out: dict[str, int] = {}
    if total == 0:
        return out
    lengths = sorted(hist)
    for q in qs:
        rank = max(1, math.ceil(q * total / 100))
        seen = 0
        for length in lengths:
            seen += hist[length]
            if seen >= rank:
                out[f"p{q}"] = length
                break
    out["max"] = lengths[-1]
    return out


def format_summary(summary: dict[str, Any], destdir: str) -> str:
    dicts = ", ".join(f"{info['file']} {info['size']} symbols" for info in summary["dictionaries"].values())
    lines = [f"Wrote {destdir} (tokenizer {summary['tokenizer']}; {dicts})"]
    if summary["splits"]:
        head = ("split", "side", "examples", "tokens", "<unk>", "p50", "p90", "p95", "p99", "max")
        rows = [head]
        for split, sides in summary["splits"].items():
            for lang, r in sides.items():
                L = r["length"]
                rows.append(
                    (
                        split,
                        lang,
                        f"{r['examples']:,}",
                        f"{r['tokens']:,}",
                        f"{100 * r['unk_rate']:.2f}%",
                        *(str(L[k]) for k in ("p50", "p90", "p95", "p99", "max")),
                    )
                )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        for r in rows:
            lines.append(
                "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            )
        lines.append("tokens and lengths include the </s> that ends every item; <unk> = share of tokens")
    return "\n".join(lines)
