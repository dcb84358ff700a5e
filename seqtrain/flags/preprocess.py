"""seqtrain-preprocess's flags: fairseq-preprocess's names and defaults, --jsonl / --parquet / --load-from-disk
input, and the tokenizer's."""

from __future__ import annotations

import argparse
from typing import Any

from seqtrain.data.tokenizer import add_args as tokenizer_add_args


def add_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """fairseq-preprocess's flags (same names and defaults) plus the tokenizer's."""
    g = parser.add_argument_group("Preprocessing")
    g.add_argument(
        "-s",
        "--source-lang",
        default=None,
        metavar="SRC",
        help="source side: input files are PREFIX.SRC (default: source; with --only-source: none, so the input "
        "is PREFIX itself and the output {split}.bin/.idx and dict.txt, as fairseq-preprocess names them)",
    )
    g.add_argument(
        "-t",
        "--target-lang",
        default=None,
        metavar="TGT",
        help="target side: input files are PREFIX.TGT (default: target)",
    )
    g.add_argument(
        "--trainpref",
        metavar="FP",
        help="train file prefix (also used to build the tokenizer and dictionaries)",
    )
    g.add_argument(
        "--validpref",
        metavar="FP",
        help="comma separated valid file prefixes (written as valid, valid1, valid2, ...)",
    )
    g.add_argument("--testpref", metavar="FP", help="comma separated test file prefixes (test, test1, ...)")
    g.add_argument("--destdir", metavar="DIR", default="data-bin", help="destination dir (default: data-bin)")
    g.add_argument(
        "--only-source",
        action="store_true",
        help="monolingual text (denoising pretraining): only the source side, fairseq-preprocess's files",
    )
    g.add_argument("--joined-dictionary", action="store_true", help="one dictionary for source and target")
    g.add_argument("--srcdict", metavar="FP", help="reuse this source dictionary (fairseq dict.txt)")
    g.add_argument("--tgtdict", metavar="FP", help="reuse this target dictionary (fairseq dict.txt)")
    g.add_argument(
        "--thresholdsrc",
        metavar="N",
        default=0,
        type=int,
        help="map words appearing less than N times in the source to <unk>",
    )
    g.add_argument(
        "--thresholdtgt",
        metavar="N",
        default=0,
        type=int,
        help="map words appearing less than N times in the target to <unk>",
    )
    g.add_argument("--nwordssrc", metavar="N", default=-1, type=int, help="number of source words to retain")
    g.add_argument("--nwordstgt", metavar="N", default=-1, type=int, help="number of target words to retain")
    g.add_argument(
        "--padding-factor",
        metavar="N",
        default=8,
        type=int,
        help="pad dictionary size to be a multiple of N (default: 8)",
    )
    g.add_argument(
        "--workers", metavar="N", default=1, type=int, help="number of parallel workers (default: 1)"
    )
    g.add_argument(
        "--dict-only", action="store_true", help="only build the tokenizer and dictionaries, then exit"
    )
    g.add_argument(
        "--dataset-impl",
        default="mmap",
        choices=["mmap"],
        help="output format; only fairseq's mmap format is written (accepted for fairseq command lines)",
    )
    add_jsonl_args(g)
    g.add_argument("--no-progress-bar", action="store_true", help="disable the progress bar")
    g.add_argument("--debug", action="store_true", help="show a traceback on errors")

    tokenizer_add_args(parser)
    return parser


def add_jsonl_args(group: Any) -> None:
    group.add_argument(
        "--jsonl",
        action="store_true",
        help="inputs are JSON lines files PREFIX.jsonl (one JSON object per line) instead of PREFIX.SRC / "
        "PREFIX.TGT line files",
    )
    group.add_argument(
        "--parquet",
        action="store_true",
        help="inputs are parquet files PREFIX.parquet (columns named by --source-key / --target-key); needs "
        "pyarrow",
    )
    group.add_argument(
        "--load-from-disk",
        action="store_true",
        help="inputs are folders PREFIX written by a Hugging Face Dataset's save_to_disk (one split each); "
        "needs pyarrow",
    )
    group.add_argument(
        "--source-key",
        metavar="KEY",
        default=None,
        help="with --jsonl, --parquet or --load-from-disk: the key or column holding the source text (default: "
        "--source-lang, e.g. document)",
    )
    group.add_argument(
        "--target-key",
        metavar="KEY",
        default=None,
        help="with --jsonl, --parquet or --load-from-disk: the key or column holding the target text (default: "
        "--target-lang, e.g. summary)",
    )
