"""seqtrain-convert: turn a seqtrain, fairseq or Hugging Face BART checkpoint into another of these formats.

    seqtrain-convert bart.base/model.pt bart-base-hf --to hf
    seqtrain-convert bart.base/model.pt bart-base.pt --to seqtrain --dict bart.base/dict.txt
    seqtrain-convert checkpoints/checkpoint_best.pt export/model.pt --to fairseq
"""
from __future__ import annotations

import argparse
import logging
import os
from typing import List, Optional

from seqtrain.data.dictionary import placeholder_dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.formats import EXPORTERS, FORMATS, read_checkpoint
from seqtrain.hub import LoadedModel, build_from_contents
from seqtrain_cli._main import run_cli


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqtrain-convert",
        description="Convert a BART checkpoint between seqtrain, fairseq and Hugging Face formats.",
    )
    p.add_argument("input", help="checkpoint file (seqtrain / fairseq) or Hugging Face model folder")
    p.add_argument("output", help="output file (--to seqtrain / fairseq) or folder (--to hf)")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument("--from", dest="from_format", default="auto", choices=("auto",) + FORMATS,
                   help="input format (default: detect)")
    p.add_argument("--dict", dest="dict_path", metavar="PATH",
                   help="dict.txt (or a data-bin folder) for fairseq inputs; default: dict.txt next to the input")
    p.add_argument("--unsafe-load", action="store_true",
                   help="allow arbitrary unpickling of the input (may run code; only for trusted files)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(argv: List[str]) -> Optional[int]:
    args = get_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    log = logging.getLogger("seqtrain_cli.convert")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise SeqtrainError("output must differ from input")
    # An HF export needs no dictionary (only the vocabulary size), so a fairseq input converts without one.
    ck = read_checkpoint(args.input, fmt=args.from_format, dict_path=args.dict_path, unsafe=args.unsafe_load,
                         require_dict=args.to != "hf")
    for note in ck.notes:
        log.info(f"{args.input}: {note}")
    if ck.src_dict is None:
        rows = ck.model["encoder.embed_tokens.weight"].shape[0]
        ck.src_dict = ck.tgt_dict = placeholder_dictionary(rows)
    model = build_from_contents(ck)  # checks the weights fit the architecture before anything is written
    lm = LoadedModel(model, ck.args, ck.src_dict, ck.tgt_dict, None, ck.format, ck.tokenizer)
    EXPORTERS[args.to](lm, args.output)
    n = sum(p.numel() for p in model.parameters())
    log.info(f"wrote {args.output} ({args.to}, from {ck.format}; arch {ck.args.arch}, {n:,} parameters, "
             f"vocabulary {len(ck.tgt_dict)})")
    return 0


def cli_main(argv: Optional[List[str]] = None) -> None:
    run_cli("seqtrain-convert", main, argv)


if __name__ == "__main__":
    cli_main()
