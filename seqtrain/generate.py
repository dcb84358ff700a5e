"""`seqtrain-generate`: summaries from a checkpoint, for a data-bin split or raw text, with fairseq's output lines.

Flow: load the checkpoint (seqtrain, fairseq or Hugging Face; its own arch, dictionaries, tokenizer and sequence
conventions) -> open the split (or tokenize `--input`) -> length-sorted batches (never dropped: every example is
generated exactly once) -> SequenceGenerator -> S-/T-/H-/D-/P- lines in batch order (as fairseq prints them),
plus, with --results-path, the detokenized hypotheses in input order (the file ROUGE reads) and ROUGE.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
import torch

from seqtrain.errors import SeqtrainError

logger = logging.getLogger("seqtrain.generate")


# ------------------------------------------------------------------------------------------------ inputs
def _load(args: argparse.Namespace, device: torch.device):
    from seqtrain.data.dictionary import Dictionary
    from seqtrain.formats import read_checkpoint
    from seqtrain.formats.fairseq import find_dictionaries
    from seqtrain.hub import model_from_contents
    from seqtrain.tasks.translation import infer_language_pair

    if not args.path:
        raise SeqtrainError("--path: give the checkpoint to generate with")
    if ":" in args.path and not os.path.exists(args.path):
        raise SeqtrainError(f"--path {args.path}: ensembles are not supported; give one checkpoint")
    if args.data is not None and not os.path.isdir(args.data):
        raise SeqtrainError(
            f"DATA {args.data}: not a folder (expected a data-bin made by seqtrain-preprocess)"
        )
    src_lang, tgt_lang = args.source_lang, args.target_lang
    if args.data is not None and (src_lang is None or tgt_lang is None):
        s, t = infer_language_pair(args.data)
        src_lang, tgt_lang = src_lang or s or "source", tgt_lang or t or "target"
    src_lang, tgt_lang = src_lang or "source", tgt_lang or "target"
    dict_path = None
    if args.data is not None and os.path.exists(os.path.join(args.data, f"dict.{src_lang}.txt")):
        dict_path = os.path.join(args.data, f"dict.{src_lang}.txt")
    try:
        overrides = json.loads(args.model_overrides)
    except json.JSONDecodeError as e:
        raise SeqtrainError(f"--model-overrides: not valid JSON ({e})") from None
    # A seqtrain checkpoint carries the dictionaries it was trained with: keep them, so the check below can
    # catch a data-bin with other ones (load_model's dict_path would replace them and hide the mismatch).
    ck = read_checkpoint(args.path, unsafe=args.unsafe_load, require_dict=False)
    if ck.format != "seqtrain" and (dict_path is not None or ck.format == "fairseq"):
        ck.src_dict, ck.tgt_dict, ck.tokenizer = find_dictionaries(args.path, ck.args, dict_path)
    if ck.src_dict is None:
        raise SeqtrainError(
            f"{args.path}: no dictionary found; give a data-bin (DATA) holding dict.{src_lang}.txt"
        )
    lm = model_from_contents(ck, overrides or None)
    if args.data is not None:  # the data-bin's dictionaries must be the ones the model was trained with
        for lang, have, side in ((src_lang, lm.src_dict, "source"), (tgt_lang, lm.tgt_dict, "target")):
            p = os.path.join(args.data, f"dict.{lang}.txt")
            if os.path.exists(p) and Dictionary.load(p) != have:
                raise SeqtrainError(
                    f"{p}: the {side} dictionary differs from the one in {args.path} "
                    f"({Dictionary.load(p).difference(have)}); generate with the data-bin the model was trained on"
                )
    tokenizer = lm.tokenizer
    if tokenizer is None:
        from seqtrain.data.tokenizer import load_databin_tokenizer

        tokenizer = load_databin_tokenizer(args.data) if args.data is not None else None
    if tokenizer is None:
        from seqtrain.data.tokenizer import build_tokenizer

        tokenizer = build_tokenizer({"kind": "none"})
    model = lm.model.to(device).eval()
    if args.fp16:
        model = model.half()
    elif args.bf16:
        model = model.to(torch.bfloat16)
    return lm, model, tokenizer, src_lang, tgt_lang


def _read_text(path: str) -> list[str]:
    try:
        if path == "-":
            return sys.stdin.read().split("\n")[:-1] if not sys.stdin.isatty() else []
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SeqtrainError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        line = text_line_of_offset(path, e.start)
        raise SeqtrainError(f"{path}:{line}: invalid UTF-8") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def text_line_of_offset(path: str, offset: int) -> int:
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def _dataset(
    args: argparse.Namespace,
    lm: Any,
    tokenizer: Any,
    src_lang: str,
    tgt_lang: str,
    max_src: int,
    max_tgt: int,
):
    """The LanguagePairDataset to generate for, the number of truncated sources, and reference texts or None."""
    from seqtrain.data.pair_dataset import LanguagePairDataset

    margs = lm.args
    conv = dict(
        left_pad_source=bool(getattr(margs, "left_pad_source", True)),
        left_pad_target=False,
        prepend_bos=bool(getattr(margs, "prepend_bos", False)),
        max_source_positions=max_src,
        max_target_positions=max_tgt,
        shuffle=True,  # only orders ties in ordered_indices (seeded), as fairseq-generate does
    )
    # --truncate-source (as in training) wins over --skip-invalid-size-inputs-valid-test, so a preset holding
    # both (fairseq's BART recipe) truncates long articles instead of leaving their summaries empty
    truncate = bool(args.truncate_source) or not args.skip_invalid_size_inputs_valid_test
    if args.input is not None:
        lines = _read_text(args.input)
        src = [
            lm.src_dict.encode_line(tokenizer.encode(line), add_if_not_exist=False, append_eos=True).long()
            for line in lines
        ]
        sizes = np.array([len(s) for s in src], dtype=np.int64)
        refs = _read_text(args.reference) if args.reference else None
        if refs is not None and len(refs) != len(lines):
            raise SeqtrainError(
                f"--reference {args.reference}: {len(refs)} lines for {len(lines)} inputs in {args.input}"
            )
        ds = LanguagePairDataset(src, sizes, lm.src_dict, truncate_source=truncate, **conv)
        return ds, sizes, refs
    from seqtrain.data.indexed_dataset import MMapIndexedDataset, check_token_ids

    if args.data is None:
        raise SeqtrainError("DATA: give a data-bin folder, or raw text with --input")
    prefixes = {}
    for lang in (src_lang, tgt_lang):
        for pair in (f"{src_lang}-{tgt_lang}", f"{tgt_lang}-{src_lang}"):
            p = os.path.join(args.data, f"{args.gen_subset}.{pair}.{lang}")
            if MMapIndexedDataset.exists(p):
                prefixes[lang] = p
                break
    if src_lang not in prefixes:
        raise SeqtrainError(
            f"--gen-subset {args.gen_subset}: no such split in {args.data} (expected "
            f"{args.gen_subset}.{src_lang}-{tgt_lang}.{src_lang}.bin/.idx)"
        )
    src = MMapIndexedDataset(prefixes[src_lang])
    tgt = MMapIndexedDataset(prefixes[tgt_lang]) if tgt_lang in prefixes else None
    if tgt is not None and len(tgt) != len(src):
        raise SeqtrainError(
            f"{prefixes[src_lang]}.idx has {len(src)} examples but {prefixes[tgt_lang]}.idx has "
            f"{len(tgt)}: source and target of --gen-subset {args.gen_subset} must be aligned"
        )
    full = bool(getattr(args, "check_data", False))
    for ds_, d, lang in ((src, lm.src_dict, src_lang), (tgt, lm.tgt_dict, tgt_lang)):
        if ds_ is not None:
            check_token_ids(ds_, len(d), os.path.join(args.data, f"dict.{lang}.txt"), full=full)
    ds = LanguagePairDataset(
        src,
        src.sizes,
        lm.src_dict,
        tgt,
        None if tgt is None else tgt.sizes,
        lm.tgt_dict,
        truncate_source=truncate,
        **conv,
    )
    return ds, np.asarray(src.sizes), None


# ------------------------------------------------------------------------------------------------ output
def _fmt_score(score: float) -> str:
    return repr(float(score) / math.log(2))  # fairseq prints base-2 scores as Python floats


def _write_lines(path: str, lines: Sequence[str]) -> None:
    from seqtrain.fileio import atomic_write

    with atomic_write(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def generate(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Generate with the parsed flags (seqtrain.options.parse_generation_args), printing to `out` (stdout);
    returns {"hypotheses": [...], "references": ..., "rouge": {...} or None, "n": ..., "lines": [...]}."""
    from seqtrain.generation.sequence_generator import build_generator, generate_batch
    from seqtrain.logging import setup_logging

    out = out or sys.stdout
    setup_logging(sys.stderr)
    if args.batch_size is None and args.max_tokens is None:
        args.batch_size = 32
    for flag in ("batch_size", "max_tokens"):
        v = getattr(args, flag)
        if v is not None and v <= 0:
            raise SeqtrainError(f"--{flag.replace('_', '-')} must be positive, got {v}")
    if args.min_len > 0 and args.max_len_a == 0 and args.min_len > args.max_len_b:
        raise SeqtrainError(
            f"--min-len {args.min_len} is above the maximum length --max-len-b {args.max_len_b}"
        )
    use_cuda = torch.cuda.is_available() and not args.cpu
    if args.fp16 and not use_cuda:
        raise SeqtrainError("--fp16 needs a CUDA device (use --bf16, or fp32, on the CPU)")
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(args.seed)

    lm, model, tokenizer, src_lang, tgt_lang = _load(args, device)
    max_src, max_tgt = model.max_positions()
    if args.min_len > max_tgt - 1:
        raise SeqtrainError(
            f"--min-len {args.min_len} is above the model's maximum target length {max_tgt - 1}"
        )
    ds, raw_src_sizes, refs = _dataset(args, lm, tokenizer, src_lang, tgt_lang, max_src, max_tgt)
    n = len(ds)
    too_long = np.flatnonzero(raw_src_sizes > max_src)
    keep = np.arange(n)
    if len(too_long):
        if args.skip_invalid_size_inputs_valid_test and not args.truncate_source:
            keep = np.setdiff1d(keep, too_long)
            logger.warning(
                f"skipped {len(too_long)} of {n} sources longer than {max_src} tokens (their "
                f"hypothesis lines are left empty); first ids: {too_long[:10].tolist()}"
            )
        else:
            logger.warning(
                f"truncated {len(too_long)} of {n} sources longer than {max_src} tokens to fit; "
                f"first ids: {too_long[:10].tolist()}"
            )

    from seqtrain.data.batching import batch_by_size

    src_sizes = np.asarray(ds.src_sizes, dtype=np.int64)
    # fairseq's order (by target, then source length), so logs line up with fairseq-generate's
    order = np.asarray(ds.ordered_indices(args.seed), dtype=np.int64)
    order = order[np.isin(order, keep)]
    batches = batch_by_size(
        order,
        num_tokens_vec=src_sizes[order],
        max_tokens=args.max_tokens,
        max_sentences=args.batch_size,
        required_batch_size_multiple=1,
    )
    generator = build_generator(model, lm.tgt_dict, args)
    force_bos = lm.tgt_dict.bos() if getattr(lm.args, "prepend_bos", False) else None

    hyps: list[str] = [""] * n
    targets: list[str | None] = [None] * n
    gen_tokens = 0
    t0 = time.perf_counter()
    log_lines: list[str] = []

    def emit(line: str) -> None:
        log_lines.append(line)
        if not args.quiet:
            print(line, file=out)

    for batch in batches:
        sample = ds.collater([ds[int(i)] for i in batch])
        sample["net_input"] = {k: v.to(device) for k, v in sample["net_input"].items()}
        with torch.no_grad():
            results = generate_batch(generator, sample, prefix_size=args.prefix_size, force_bos=force_bos)
        for row, (sid, hypos) in enumerate(results):
            src_row = sample["net_input"]["src_tokens"][row]
            src_str = lm.src_dict.string(src_row.cpu(), args.post_process)
            emit(f"S-{sid}\t{src_str}")
            if sample.get("target") is not None:
                tgt_row = sample["target"][row]
                target_sym = lm.tgt_dict.string(tgt_row)
                targets[sid] = tokenizer.decode(target_sym)
                emit(f"T-{sid}\t{lm.tgt_dict.string(tgt_row, args.post_process)}")
            for k, h in enumerate(hypos[: args.nbest]):
                tokens = h["tokens"].cpu()
                hypo_str = lm.tgt_dict.string(tokens, args.post_process)
                detok = tokenizer.decode(lm.tgt_dict.string(tokens))
                if k == 0:
                    hyps[sid] = detok
                gen_tokens += len(tokens)
                score = _fmt_score(h["score"])
                emit(f"H-{sid}\t{score}\t{hypo_str}")
                emit(f"D-{sid}\t{score}\t{detok}")
                pos = (h["positional_scores"].float().cpu() / math.log(2)).tolist()
                emit(f"P-{sid}\t" + " ".join(f"{x:.4f}" for x in pos))
    elapsed = time.perf_counter() - t0
    summary = (
        f"Generated {len(keep)} sentences ({gen_tokens} tokens) in {elapsed:.1f}s "
        f"({len(keep) / max(elapsed, 1e-9):.2f} sentences/s, {gen_tokens / max(elapsed, 1e-9):.2f} tokens/s)"
    )
    print(summary, file=out)

    split = "input" if args.input is not None else args.gen_subset
    if refs is None and args.input is None:
        refs = [t if t is not None else "" for t in targets] if any(t is not None for t in targets) else None
    rouge = None
    if args.scoring == "rouge":
        if refs is None:
            raise SeqtrainError(
                "--scoring rouge: no references (the split has no target side; with --input give "
                "--reference FILE)"
            )
        from seqtrain.scoring.rouge import format_summary, score_pairs

        rouge = score_pairs(hyps, refs)
        print(f"Generate {split} with beam={args.beam}: {format_summary(rouge)}", file=out)
    if args.results_path:
        os.makedirs(args.results_path, exist_ok=True)
        _write_lines(os.path.join(args.results_path, f"generate-{split}.txt"), log_lines + [summary])
        _write_lines(os.path.join(args.results_path, f"hypotheses-{split}.txt"), hyps)
        if refs is not None:
            _write_lines(os.path.join(args.results_path, f"references-{split}.txt"), refs)
        if rouge is not None:
            from seqtrain.scoring.rouge import write_json

            write_json(
                rouge,
                os.path.join(args.results_path, f"rouge-{split}.json"),
                checkpoint=args.path,
                split=split,
                beam=args.beam,
                lenpen=args.lenpen,
                n=len(hyps),
            )
    return {"hypotheses": hyps, "references": refs, "rouge": rouge, "n": n, "lines": log_lines}
