"""seqtrain-convert: turn a seqtrain, fairseq or Hugging Face BART checkpoint into another of these formats.

seqtrain-convert bart.base/model.pt bart-base-hf --to hf
seqtrain-convert bart.base/model.pt bart-base.pt --to seqtrain --dict bart.base/dict.txt
seqtrain-convert checkpoints/checkpoint_best.pt export/model.pt --to fairseq
"""

from __future__ import annotations

import argparse
import logging
import os

from seqtrain.checkpoint.fairseq import export_fairseq
from seqtrain.checkpoint.formats import EXPORTERS, read_checkpoint
from seqtrain.checkpoint.load import LoadedModel, build_from_contents
from seqtrain.data.dictionary import placeholder_dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.logging import setup_logging
from seqtrain.models.lora import merge_lora

logger = logging.getLogger("seqtrain.convert")


def convert(args: argparse.Namespace) -> None:
    """Convert with the parsed flags of seqtrain.flags.parsers.get_convert_parser."""
    setup_logging()
    # (an output that is a link to the input would be written through the link, over the input)
    if os.path.realpath(args.input) == os.path.realpath(args.output):
        raise SeqtrainError("output must differ from input")
    # An HF export needs no dictionary (only the vocabulary size), so a fairseq input converts without one.
    ck = read_checkpoint(
        args.input,
        fmt=args.from_format,
        dict_path=args.dict_path,
        unsafe=args.unsafe_load,
        require_dict=args.to != "hf",
    )
    if getattr(args, "ema", False):
        ema = ((ck.state or {}).get("extra_state") or {}).get("ema")
        if not isinstance(ema, dict) or not ema:
            raise SeqtrainError(
                f"{args.input}: no EMA of the weights in it (train with --store-ema to keep one)"
            )
        ck.model = dict(ema)
        logger.info(f"{args.input}: exporting the EMA of the weights (--ema)")
    for note in ck.notes:
        logger.info(f"{args.input}: {note}")
    if ck.src_dict is None:
        rows = ck.model["encoder.embed_tokens.weight"].shape[0]
        ck.src_dict = ck.tgt_dict = placeholder_dictionary(rows)
    # checks the weights fit the architecture before anything is written
    model = build_from_contents(ck, resize_vocab=args.resize_vocab)
    if merge_lora(model):  # fairseq and Hugging Face know no adapters: export W + (alpha / R) B A
        ck.args.lora_rank = 0
        logger.info(f"{args.input}: LoRA adapters merged into their weights")
    lm = LoadedModel(model, ck.args, ck.src_dict, ck.tgt_dict, None, ck.format, ck.tokenizer)
    if args.to == "fairseq":  # carries the update count and data position over into optimizer_history
        export_fairseq(lm, args.output, source=ck.state)
    else:
        EXPORTERS[args.to](lm, args.output)
    n = sum(p.numel() for p in model.parameters())
    logger.info(
        f"wrote {args.output} ({args.to}, from {ck.format}; arch {ck.args.arch}, {n:,} parameters, "
        f"vocabulary {len(ck.tgt_dict)})"
    )
