"""`seqtrain-generate`: summaries from a checkpoint, for raw text (--input) or a data-bin split.

Flow: check every output path -> load the checkpoint (seqtrain, fairseq or Hugging Face; its own arch,
dictionaries, tokenizer, sequence convention and, for Hugging Face, generation defaults; several joined by ':' make
an ensemble) -> tokenize `--input` or open the split -> this shard's / this rank's examples -> length-sorted
batches (never dropped: every example is generated exactly once) -> SequenceGenerator (with --score-reference:
SequenceScorer, the references scored) -> rank 0 gathers, then writes either one detokenized summary per input
line in input order (`--output-format text`, the default with --input) or fairseq's S-/T-/H-/D-/P- lines in
fairseq-generate's batch order (`--output-format fairseq`, the default for a data-bin split); with
--results-path also the result files (hypotheses in input order, references, ROUGE), all published together.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist

from seqtrain.config import from_args
from seqtrain.data.indexed_dataset import MMapIndexedDataset, check_token_ids
from seqtrain.errors import SeqtrainError, stop_on_sigterm
from seqtrain.fileio import check_outputs_apart, text_lines, write_files
from seqtrain.generation import runner
from seqtrain.generation.output import (
    Progress,
    check_file_writable,
    check_folder_writable,
    fairseq_lines,
    write_out,
)
from seqtrain.generation.program import GenerateConfig, load_generation_model, run_inputs
from seqtrain.generation.rerank import check_rerank, rerank
from seqtrain.generation.scorer import SequenceScorer
from seqtrain.generation.search import check_generation_args, flag_name
from seqtrain.logging import setup_logging
from seqtrain.scoring.rouge import check_some_text, format_summary, score_pairs

logger = logging.getLogger("seqtrain.generate")


def read_text(path: str) -> list[str]:
    """The lines of a text file ('-': stdin), without their line ends ("\\n" or "\\r\\n"), read with
    seqtrain.fileio's bound on a line's length and strict UTF-8; errors name the file (or stdin) and line."""
    try:
        if path == "-":
            if sys.stdin is None:  # started with stdin closed (0<&-)
                raise SeqtrainError("--input -: stdin is closed; give the text on stdin, or --input FILE")
            if sys.stdin.isatty():
                logger.info(
                    "reading documents, one per line, until Ctrl-D (seqtrain-interactive answers each line)"
                )
            raw = getattr(sys.stdin, "buffer", None)
            if raw is None:  # a text stream put in its place (tests, notebooks)
                text = sys.stdin.read()
                runner.check_utf8(text, "stdin", 1)
                return text.split("\n")[:-1] if text.endswith("\n") or not text else text.split("\n")
            # bytes, decoded strictly: the C locale's 'surrogateescape' would let invalid ones through
            return [line.removesuffix("\r") for line in text_lines(raw, "stdin")]
        with open(path, "rb") as f:
            return [line.removesuffix("\r") for line in text_lines(f, path)]
    except FileNotFoundError:
        raise SeqtrainError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise SeqtrainError(f"{path}: is a folder; give a text file, one document per line") from None
    except OSError as e:
        raise SeqtrainError(f"{path}: cannot read ({e.strerror})") from None


def results_file(cfg: GenerateConfig, name: str) -> str:
    """--results-path's file `name` (generate.txt, hypotheses.txt, references.txt, rouge.json) for the split
    generated: NAME-SPLIT.EXT, SPLIT being --gen-subset or "input" for --input."""
    split = "input" if cfg.inputs.input is not None else cfg.dataset.gen_subset
    stem, ext = os.path.splitext(name)
    return os.path.join(cfg.load.results_path, f"{stem}-{split}{ext}")


RESULT_FILES = ("generate.txt", "hypotheses.txt", "references.txt", "rouge.json")


def check_settings(cfg: GenerateConfig, extra: Sequence[tuple[str, str]] = ()) -> None:
    """seqtrain-generate's checks across its settings, before anything loads; fills the defaults that depend
    on others (--batch-size 32 without --max-tokens, --output-format by --input). Its outputs (and a calling
    program's, `extra`) are checked against its inputs by seqtrain.fileio's rule."""
    ds, search, inputs, outputs = cfg.dataset, cfg.search, cfg.inputs, cfg.outputs
    if ds.batch_size is None and ds.max_tokens is None:
        ds.batch_size = 32
    for flag, v in (("--batch-size", ds.batch_size), ("--max-tokens", ds.max_tokens)):
        if v is not None and v <= 0:
            raise SeqtrainError(f"{flag} must be positive, got {v}")
    if search.min_len > 0 and search.max_len_a == 0 and search.min_len > search.max_len_b:
        raise SeqtrainError(
            f"--min-len {search.min_len} is above the maximum length --max-len-b {search.max_len_b}"
        )
    if not 0 <= outputs.shard_id < outputs.num_shards:
        raise SeqtrainError(
            f"--shard-id must be in [0, --num-shards {outputs.num_shards}), got {outputs.shard_id}"
        )
    if not cfg.load.path:
        raise SeqtrainError("--path: give the checkpoint to generate with")
    if cfg.rerank.rerank_lenpen is not None and cfg.rerank.rerank != "length":
        raise SeqtrainError("--rerank-lenpen: only --rerank length uses it")
    if cfg.rerank.rerank and inputs.score_reference:
        raise SeqtrainError(
            "--rerank with --score-reference: the references are scored, there is no beam to rerank"
        )
    if outputs.output_format is None:
        outputs.output_format = "text" if inputs.input is not None else "fairseq"
    written = [("--output", outputs.output), ("--log-file", cfg.log.log_file), *extra]
    if cfg.load.results_path:
        written += [("--results-path", results_file(cfg, name)) for name in RESULT_FILES]
    check_outputs_apart(written, run_inputs(cfg))
    if cfg.load.results_path:
        check_folder_writable(cfg.load.results_path, "--results-path")
    if outputs.output:
        check_file_writable(outputs.output, "--output")
    elif sys.stdout is None:  # started with stdout closed (1>&-)
        raise SeqtrainError("stdout is closed: the summaries have nowhere to go; give --output FILE")


def open_dataset(cfg: GenerateConfig, loaded: runner.GenerationModel):
    """The dataset to generate for, its raw source sizes, reference texts (--reference) or None, and a digest of
    the input's text ('' for a data-bin split, whose sizes stand for it)."""
    inputs, subset = cfg.inputs, cfg.dataset.gen_subset
    truncate = bool(cfg.dataset.truncate_source) or not cfg.dataset.skip_invalid_size_inputs_valid_test
    if inputs.input is not None:
        lines = read_text(inputs.input)
        refs = read_text(inputs.reference) if inputs.reference else None
        if refs is not None and len(refs) != len(lines):
            raise SeqtrainError(
                f"--reference {inputs.reference}: {len(refs)} lines for {len(lines)} inputs in {inputs.input}"
            )
        if refs is not None:
            check_some_text(refs, f"--reference {inputs.reference}", "references")
        src = runner.encode(loaded, lines)
        digest = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogatepass")).hexdigest()
        return runner.text_dataset(loaded, src, truncate), np.array([len(s) for s in src]), refs, digest

    if cfg.data is None:
        raise SeqtrainError("DATA: give a data-bin folder, or raw text with --input")
    s, t = loaded.src_lang, loaded.tgt_lang
    prefixes = {}
    for lang in (s, t):
        for pair in (f"{s}-{t}", f"{t}-{s}"):
            p = os.path.join(cfg.data, f"{subset}.{pair}.{lang}")
            if MMapIndexedDataset.exists(p):
                prefixes[lang] = p
                break
    if s not in prefixes:
        raise SeqtrainError(
            f"--gen-subset {subset}: no such split in {cfg.data} (expected {subset}.{s}-{t}.{s}.bin/.idx)"
        )
    src = MMapIndexedDataset(prefixes[s])
    tgt = MMapIndexedDataset(prefixes[t]) if t in prefixes else None
    if tgt is not None and len(tgt) != len(src):
        raise SeqtrainError(
            f"{prefixes[s]}.idx has {len(src)} examples but {prefixes[t]}.idx has {len(tgt)}: source and target "
            f"of --gen-subset {subset} must be aligned"
        )
    full = bool(cfg.data_check.check_data)
    for data, d, lang in ((src, loaded.lm.src_dict, s), (tgt, loaded.lm.tgt_dict, t)):
        if data is not None:
            check_token_ids(data, len(d), os.path.join(cfg.data, f"dict.{lang}.txt"), full=full)
    return runner.text_dataset(loaded, src, truncate, tgt), np.asarray(src.sizes), None, ""


def run_settings(cfg: GenerateConfig) -> dict[str, Any]:
    """The settings that decide what a run generates, by flag: the search's, --rerank's, the output format and
    the input settings (not the batching, which only the ranks' shares differ in)."""
    inputs = cfg.inputs
    settings = {flag_name(k): v for k, v in dataclasses.asdict(cfg.search).items()}
    settings.update({flag_name(k): v for k, v in dataclasses.asdict(cfg.rerank).items()})
    for dest in (
        "post_process",
        "compute_type",
        "max_source_positions",
        "max_target_positions",
        "score_reference",
    ):
        settings[flag_name(dest)] = getattr(inputs, dest)
    settings["--model-overrides"] = inputs.model_overrides
    settings["--output-format"] = cfg.outputs.output_format
    settings["--truncate-source"] = cfg.dataset.truncate_source
    return settings


def same_run(every: list[tuple[str, int, str, dict[str, Any]]]) -> None:
    """Refuse (on every rank, with the same line) ranks that would not make one run: each rank's (input name,
    example count, digest of the input, run_settings) as all_gather_object collected them. Other settings
    (rank 0 --beam 5, rank 1 --beam 1) gave mixed output and exit 0; another --input per rank ended rank 0 with
    a KeyError while it merged the results."""
    first = every[0]
    for rank, (*_, settings) in enumerate(every):
        diff = [k for k in first[3] if settings.get(k) != first[3][k]]
        if diff:
            ours = ", ".join(f"{k} {first[3][k]}" for k in diff[:3])
            theirs = ", ".join(f"{k} {settings.get(k)}" for k in diff[:3])
            raise SeqtrainError(
                f"the ranks have different generation settings: rank 0 {ours}, rank {rank} {theirs}; every rank "
                "must generate with the same settings (the ranks split one run)"
            )
    other = next((r for r, x in enumerate(every) if x[1:3] != first[1:3]), None)
    if other is not None:
        (name0, n0), (name1, n1) = first[:2], every[other][:2]
        same = " (the same name, other content)" if name0 == name1 else ""
        raise SeqtrainError(
            f"the ranks have different inputs: rank 0 has {n0} examples from {name0}, rank {other} {n1} from "
            f"{name1}{same}; every rank must generate for the same input (the ranks split it)"
        )


def _same_run_on_every_rank(cfg: GenerateConfig, raw_sizes: np.ndarray, content: str, world: int) -> None:
    """Ranks split one input between them, generating with the same settings: same_run on what every rank has."""
    digest = hashlib.sha256(np.ascontiguousarray(raw_sizes, dtype=np.int64).tobytes())
    digest.update(content.encode())
    inp = cfg.inputs.input
    name = inp if inp is not None else f"{cfg.data} --gen-subset {cfg.dataset.gen_subset}"
    every: list[Any] = [None] * world
    dist.all_gather_object(every, (name, len(raw_sizes), digest.hexdigest(), run_settings(cfg)))
    same_run(every)


def _world() -> tuple[int, int]:
    """(rank, world size) under torchrun (WORLD_SIZE > 1), else (0, 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else (0, 1)


def generate(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Generate with the parsed flags (seqtrain.generation.options.parse_generation_args), writing to `out` (stdout) or
    --output. Returns (on rank 0; {} on other ranks) {"hypotheses": best per example in input order,
    "references", "rouge", "n", "lines": the fairseq lines in batch order}."""
    cfg = from_args(GenerateConfig, args)  # the program's one read of its flags
    check_settings(cfg)
    try:
        handler = setup_logging(sys.stderr, log_file=cfg.log.log_file)
    except OSError as e:
        raise SeqtrainError(f"--log-file {cfg.log.log_file}: cannot write ({e.strerror})") from None
    rank, world = _world()
    try:
        with stop_on_sigterm():  # the outputs are written at the end: until then, nothing was
            return _generate_on_ranks(cfg, out or sys.stdout, rank, world)
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def _generate_on_ranks(cfg: GenerateConfig, out: TextIO, rank: int, world: int) -> dict[str, Any]:
    """One process's part: the whole run, or under torchrun this rank's share in a process group."""
    if world == 1:
        return _generate(cfg, out, 0, 1)
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
    use_cuda = torch.cuda.is_available() and not cfg.device.cpu
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        return _generate(cfg, out, rank, world)
    finally:
        dist.destroy_process_group()


def _generate(cfg: GenerateConfig, out: TextIO, rank: int, world: int) -> dict[str, Any]:
    loaded = load_generation_model(cfg)
    search, inputs, ds_cfg, rr = cfg.search, cfg.inputs, cfg.dataset, cfg.rerank
    max_src, max_tgt = loaded.model.max_positions()
    max_src, max_tgt = min(max_src, inputs.max_source_positions), min(max_tgt, inputs.max_target_positions)
    if search.min_len > max_tgt - 1:
        raise SeqtrainError(
            f"--min-len {search.min_len} is above the model's maximum target length {max_tgt - 1}"
        )
    if inputs.score_reference:
        if inputs.input is not None:
            raise SeqtrainError(
                "--score-reference scores a data-bin split's references; --input text has none"
            )
        generator: Any = SequenceScorer(loaded.model, loaded.lm.tgt_dict, search.packed_encoder)
    else:
        check_generation_args(search, rerank=bool(rr.rerank))
        check_rerank(rr.rerank, search.beam)
        config = search
        if rr.rerank:  # it chooses among all --beam finished hypotheses: the search returns them all
            config = dataclasses.replace(config, nbest=config.beam)
        generator = runner.make_generator(loaded, config)
    ds, raw_sizes, refs, content = open_dataset(cfg, loaded)
    n = len(ds)
    if world > 1:
        _same_run_on_every_rank(cfg, raw_sizes, content, world)
    shards, shard = cfg.outputs.num_shards, cfg.outputs.shard_id
    lo, hi = shard * n // shards, (shard + 1) * n // shards
    mine = np.arange(lo, hi)
    too_long = mine[raw_sizes[mine] > max_src]
    if len(too_long) and ds_cfg.skip_invalid_size_inputs_valid_test and not ds_cfg.truncate_source:
        mine = np.setdiff1d(mine, too_long)
        logger.warning(
            f"skipped {len(too_long)} of {hi - lo} sources longer than {max_src} tokens (their hypothesis lines "
            f"are left empty); first ids: {too_long[:10].tolist()}"
        )
    elif len(too_long):
        logger.warning(
            f"truncated {len(too_long)} of {hi - lo} sources longer than {max_src} tokens to fit; first ids: "
            f"{too_long[:10].tolist()}"
        )
    # fairseq's order (by target, then source length), so logs line up with fairseq-generate's; ranks take
    # every world-th example of it, so each gets a share of every length
    order = runner.order_examples(ds, mine, cfg.device.seed)
    batches = runner.plan_batches(ds, order[rank::world], ds_cfg.max_tokens, ds_cfg.batch_size)
    log = cfg.log
    progress = Progress(
        len(order[rank::world]), log.log_format, log.no_progress_bar, log.log_interval, enabled=rank == 0
    )
    results: dict[int, tuple] = {}
    rerank_lenpen = 1.0 if rr.rerank_lenpen is None else rr.rerank_lenpen
    t0 = time.perf_counter()
    try:
        for sid, sample, row, hypos in runner.run_batches(
            loaded, generator, ds, batches, search.prefix_size, progress.update
        ):
            if rr.rerank:  # on the finished beam only (seqtrain.generation.rerank)
                hypos = rerank(hypos, rr.rerank, lambda t: runner.decode(loaded, t), rerank_lenpen)
            results[sid] = fairseq_lines(loaded, sid, sample, row, hypos, search.nbest, inputs.post_process)
    finally:
        progress.close()
    if world > 1:
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(results, gathered if rank == 0 else None, dst=0)
        if rank != 0:
            return {}
        results = {k: v for part in gathered for k, v in part.items()}
    elapsed = time.perf_counter() - t0
    return _write(cfg, out, loaded, results, order, lo, hi, refs, elapsed)


def _write(
    cfg: GenerateConfig,
    out: TextIO,
    loaded: runner.GenerationModel,
    results: dict[int, tuple],
    order: np.ndarray,
    lo: int,
    hi: int,
    refs: list[str] | None,
    elapsed: float,
) -> dict[str, Any]:
    """Write the output (text or fairseq lines) and the result files of examples lo..hi-1, all at the end."""
    inputs, search, output, results_path = cfg.inputs, cfg.search, cfg.outputs.output, cfg.load.results_path
    lines = [line for sid in order.tolist() for line in results[sid][0]]
    hyps = [results[i][1][0] if i in results else "" for i in range(lo, hi)]
    if refs is None and inputs.input is None and any(r[2] is not None for r in results.values()):
        refs = [results[i][2] if i in results and results[i][2] is not None else "" for i in range(lo, hi)]
    elif refs is not None:
        refs = refs[lo:hi]
    ntok = sum(r[3] for r in results.values())
    rate = len(order) / max(elapsed, 1e-9)
    summary = (
        f"Generated {len(order)} sentences ({ntok} tokens) in {elapsed:.1f}s ({rate:.2f} sentences/s, "
        f"{ntok / max(elapsed, 1e-9):.2f} tokens/s)"
    )
    text_out = cfg.outputs.output_format == "text"
    if text_out:
        body = [t for i in range(lo, hi) for t in (results[i][1] if i in results else [""] * search.nbest)]
    else:
        body = ([] if inputs.quiet else lines) + [summary]
    split = "input" if inputs.input is not None else cfg.dataset.gen_subset
    rouge = None
    if inputs.scoring == "rouge":
        if refs is None:
            raise SeqtrainError(
                "--scoring rouge: no references (the split has no target side; with --input give --reference FILE)"
            )

        rouge = score_pairs(hyps, refs)
        line = f"Generate {split} with beam={search.beam}: {format_summary(rouge)}"
        if text_out:
            logger.info(line)
        else:
            body.append(line)
    if text_out:
        logger.info(summary)
    files: dict[str, str] = {}
    if output:
        files[output] = "".join(x + "\n" for x in body)
    if results_path:
        files[results_file(cfg, "generate.txt")] = "".join(x + "\n" for x in lines + [summary])
        files[results_file(cfg, "hypotheses.txt")] = "".join(x + "\n" for x in hyps)
        if refs is not None:
            files[results_file(cfg, "references.txt")] = "".join(x + "\n" for x in refs)
        if rouge is not None:
            meta = dict(
                checkpoint=cfg.load.path, split=split, beam=search.beam, lenpen=search.lenpen, n=len(hyps)
            )
            files[results_file(cfg, "rouge.json")] = (
                json.dumps({**meta, **rouge}, indent=2, sort_keys=True) + "\n"
            )
    write_files(files)
    if not output:
        write_out(out, body)
    return {"hypotheses": hyps, "references": refs, "rouge": rouge, "n": hi - lo, "lines": lines}
