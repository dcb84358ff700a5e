"""`seqtrain-interactive`: summaries of text read line by line (fairseq-interactive's flags).

Reads `--input` (default stdin) one line at a time and answers each buffer of `--buffer-size` lines as soon as it
is full or the input ends, so it works in a pipe and on a terminal (a line typed, its summary printed). Output:
one detokenized summary per line (`--nbest` lines each), or with `--output-format fairseq` the S-/H-/D-/P- lines
with ids counted over the whole session, as fairseq-interactive prints them. Generation goes through the same
functions as seqtrain-generate (seqtrain.generation.runner): a line gets the summary seqtrain-generate writes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from seqtrain.config import from_args, setting, settings
from seqtrain.errors import SeqtrainError, stop_on_sigterm
from seqtrain.fileio import MAX_LINE_BYTES, bounded_lines, check_outputs_apart, decode_line, line_too_long
from seqtrain.flag_bounds import POSITIVE_INT
from seqtrain.generation import runner
from seqtrain.generation.output import fairseq_lines, write_out
from seqtrain.generation.program import GenerateConfig, load_generation_model, run_inputs
from seqtrain.generation.search import check_generation_args
from seqtrain.logging import setup_logging


@settings
class InteractiveConfig:
    """seqtrain-interactive's buffering"""

    buffer_size: int = setting(
        1,
        "read N lines, then answer them together (default: 1)",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )


logger = logging.getLogger("seqtrain.interactive")


def interactive(args: argparse.Namespace, inp: TextIO | None = None, out: TextIO | None = None) -> int:
    """Answer the lines of `inp` (stdin, or --input FILE) on `out` (stdout); returns the number of lines."""
    cfg = from_args(GenerateConfig, args)  # the program's one read of its flags
    buffer_size = from_args(InteractiveConfig, args).buffer_size
    out = out or sys.stdout
    if out is None:  # started with stdout closed (1>&-): Python has no sys.stdout
        raise SeqtrainError("stdout is closed: the summaries have nowhere to go; run with stdout open")
    if buffer_size < 1:
        raise SeqtrainError(f"--buffer-size must be >= 1, got {buffer_size}")
    batch_size, max_tokens = cfg.dataset.batch_size, cfg.dataset.max_tokens
    if batch_size is not None and batch_size <= 0 or max_tokens is not None and max_tokens <= 0:
        raise SeqtrainError("--batch-size and --max-tokens must be positive")
    if not cfg.load.path:
        raise SeqtrainError("--path: give the checkpoint to generate with")
    check_outputs_apart([("--log-file", cfg.log.log_file)], run_inputs(cfg))
    try:
        handler = setup_logging(sys.stderr, log_file=cfg.log.log_file)
    except OSError as e:
        raise SeqtrainError(f"--log-file {cfg.log.log_file}: cannot write ({e.strerror})") from None
    close = False
    source = cfg.inputs.input
    if inp is None and source != "-":
        try:
            inp, close = open(source, encoding="utf-8"), True
        except OSError as e:
            raise SeqtrainError(f"--input {source}: cannot read ({e.strerror})") from None
    inp = inp or sys.stdin
    if inp is None:  # started with stdin closed (0<&-)
        raise SeqtrainError("stdin is closed: give the text on stdin, or with --input FILE")
    where = "stdin" if source == "-" else source
    try:
        loaded = load_generation_model(cfg)
        check_generation_args(cfg.search)
        generator = runner.make_generator(loaded, cfg.search)
        if inp.isatty():
            logger.info(f"type a text and press Enter; answers come every {buffer_size} line(s); Ctrl-D ends")
        with stop_on_sigterm(""):  # the answers printed so far stay
            return _loop(cfg, buffer_size, loaded, generator, inp, out, where)
    finally:
        if close:
            inp.close()
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def _loop(
    cfg: GenerateConfig,
    buffer_size: int,
    loaded: runner.GenerationModel,
    generator,
    inp: TextIO,
    out: TextIO,
    where: str,
) -> int:
    start, n_tok, n_truncated, t0 = 0, 0, 0, time.perf_counter()
    buffer: list[str] = []

    max_src = min(loaded.model.max_positions()[0], cfg.inputs.max_source_positions)

    def answer() -> None:
        nonlocal start, n_tok, n_truncated
        sources = runner.encode(loaded, buffer)
        too_long = [start + i for i, s in enumerate(sources) if len(s) > max_src]
        if too_long and not n_truncated:
            # seqtrain-generate's warning, with the ids the fairseq output format numbers lines by; said once
            # a session (not for every line typed), the last line counts them all
            logger.warning(
                f"truncated {len(too_long)} of {len(sources)} sources longer than {max_src} tokens to fit; "
                f"first ids: {too_long[:10]}"
            )
        n_truncated += len(too_long)
        ds = runner.text_dataset(loaded, sources)
        order = runner.order_examples(ds, None, cfg.device.seed)
        batches = runner.plan_batches(ds, order, cfg.dataset.max_tokens, cfg.dataset.batch_size)
        results = {}
        for sid, sample, row, hypos in runner.run_batches(loaded, generator, ds, batches):
            results[sid] = fairseq_lines(
                loaded, start + sid, sample, row, hypos, cfg.search.nbest, cfg.inputs.post_process
            )
        answers = []
        for i in range(len(buffer)):
            lines, texts, _, ntok = results[i]
            n_tok += ntok
            answers += lines if cfg.outputs.output_format == "fairseq" else texts
        write_out(out, answers)
        start += len(buffer)
        buffer.clear()

    for _, line in _lines(inp, where):
        buffer.append(line)
        if len(buffer) >= buffer_size:
            answer()
    if buffer:
        answer()
    elapsed = time.perf_counter() - t0
    cut = f"; {n_truncated} sources truncated to {max_src} tokens" if n_truncated else ""
    logger.info(f"Generated {start} sentences ({n_tok} tokens) in {elapsed:.1f}s{cut}")
    return start


def _lines(inp: TextIO, where: str) -> Iterator[tuple[int, str]]:
    """(line number, line without its line end) of `inp`, each read as it arrives, within seqtrain.fileio's
    bound on a line's length. A real file or stdin is read as bytes, each line decoded strictly here, whatever
    error handler the locale gave the text layer (the C locale's 'surrogateescape' let invalid bytes through as
    surrogates, to the tokenizer); a file's "\\r\\n" ends a line as its "\\n" does (stdin's keeps the
    "\\r", as it always did)."""
    raw = getattr(inp, "buffer", None)
    universal = inp is not sys.stdin
    lineno = 0
    while True:
        if raw is not None:
            data = next(bounded_lines(raw, where, lineno + 1), b"")
            line = decode_line(data, where, lineno + 1)
            if universal and line.endswith("\r\n"):
                line = line[:-2] + "\n"
        else:  # a text stream put in place of stdin (tests, notebooks)
            line = inp.readline(MAX_LINE_BYTES + 1)
            if len(line) > MAX_LINE_BYTES and not line.endswith("\n"):
                raise line_too_long(where, lineno + 1)
        if not line:
            return
        lineno += 1
        runner.check_utf8(line, where, lineno)
        yield lineno, line[:-1] if line.endswith("\n") else line
