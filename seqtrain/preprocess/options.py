"""seqtrain-preprocess's settings (fairseq-preprocess's flag names and defaults, --jsonl / --parquet /
--load-from-disk input) and its parser, composed from them and the tokenizer's (seqtrain.data.tokenizer)."""

from __future__ import annotations

import argparse

from seqtrain.config import add_settings, setting, settings
from seqtrain.data.tokenizer import TokenizerConfig
from seqtrain.flag_bounds import INT_MAX, Bounds
from seqtrain.flags.parsers import ArgumentParser, add_negations

_KEY_HELP = (
    "with --jsonl, --parquet or --load-from-disk: the key or column holding the {side} text (default: "
    "--{side}-lang, e.g. {example})"
)


@settings
class PreprocessConfig:
    """Preprocessing"""

    source_lang: str | None = setting(
        None,
        "source side: input files are PREFIX.SRC (default: source; with --only-source: none, so the input "
        "is PREFIX itself and the output {split}.bin/.idx and dict.txt, as fairseq-preprocess names them)",
        flags=("-s", "--source-lang"),
        metavar="SRC",
    )
    target_lang: str | None = setting(
        None,
        "target side: input files are PREFIX.TGT (default: target)",
        flags=("-t", "--target-lang"),
        metavar="TGT",
    )
    trainpref: str | None = setting(
        None, "train file prefix (also used to build the tokenizer and dictionaries)", metavar="FP"
    )
    validpref: str | None = setting(
        None, "comma separated valid file prefixes (written as valid, valid1, valid2, ...)", metavar="FP"
    )
    testpref: str | None = setting(
        None, "comma separated test file prefixes (test, test1, ...)", metavar="FP"
    )
    destdir: str = setting("data-bin", "destination dir (default: data-bin)", metavar="DIR")
    only_source: bool = setting(
        False,
        "monolingual text (denoising pretraining): only the source side, fairseq-preprocess's files",
        action="store_true",
    )
    joined_dictionary: bool = setting(False, "one dictionary for source and target", action="store_true")
    srcdict: str | None = setting(None, "reuse this source dictionary (fairseq dict.txt)", metavar="FP")
    tgtdict: str | None = setting(None, "reuse this target dictionary (fairseq dict.txt)", metavar="FP")
    thresholdsrc: int = setting(
        0, "map words appearing less than N times in the source to <unk>", type=int, metavar="N"
    )
    thresholdtgt: int = setting(
        0, "map words appearing less than N times in the target to <unk>", type=int, metavar="N"
    )
    nwordssrc: int = setting(
        -1, "number of source words to retain", type=int, metavar="N", bounds=Bounds(1, INT_MAX, off=-1)
    )
    nwordstgt: int = setting(
        -1, "number of target words to retain", type=int, metavar="N", bounds=Bounds(1, INT_MAX, off=-1)
    )
    padding_factor: int = setting(
        8,
        "pad dictionary size to be a multiple of N (default: 8)",
        type=int,
        metavar="N",
        bounds=Bounds(1, 1 << 16),
    )
    workers: int = setting(
        1, "number of parallel workers (default: 1)", type=int, metavar="N", bounds=Bounds(1, 1024)
    )
    dict_only: bool = setting(
        False, "only build the tokenizer and dictionaries, then exit", action="store_true"
    )
    dataset_impl: str = setting(
        "mmap",
        "output format; only fairseq's mmap format is written (accepted for fairseq command lines)",
        choices=["mmap"],
    )
    # the input formats (seqtrain.preprocess.jsonl, seqtrain.preprocess.tables)
    jsonl: bool = setting(
        False,
        "inputs are JSON lines files PREFIX.jsonl (one JSON object per line) instead of PREFIX.SRC / "
        "PREFIX.TGT line files",
        action="store_true",
    )
    parquet: bool = setting(
        False,
        "inputs are parquet files PREFIX.parquet (columns named by --source-key / --target-key); needs "
        "pyarrow",
        action="store_true",
    )
    load_from_disk: bool = setting(
        False,
        "inputs are folders PREFIX written by a Hugging Face Dataset's save_to_disk (one split each); "
        "needs pyarrow",
        action="store_true",
    )
    source_key: str | None = setting(None, _KEY_HELP.format(side="source", example="document"), metavar="KEY")
    target_key: str | None = setting(None, _KEY_HELP.format(side="target", example="summary"), metavar="KEY")
    no_progress_bar: bool = setting(False, "disable the progress bar", action="store_true")
    debug: bool = setting(False, "show a traceback on errors", action="store_true")


def get_preprocessing_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="seqtrain-preprocess",
        description="Tokenize, build dictionaries and binarize parallel text into a fairseq-style data-bin.",
    )
    add_settings(parser, PreprocessConfig)
    add_settings(parser, TokenizerConfig)
    return add_negations(parser)
