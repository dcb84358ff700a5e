"""Where generation writes: output paths checked before any work (the result files are published together, whole
or not at all, by seqtrain.fileio.write_files), fairseq's S-/T-/H-/D-/P- lines, and the progress display."""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
import time
from typing import Any, TextIO

from tqdm import tqdm

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import output_target
from seqtrain.flag_bounds import Bounds
from seqtrain.generation.runner import decode


@settings
class OutputConfig:
    """seqtrain-generate's output and sharding"""

    output: str | None = setting(
        None,
        "write the summaries (or fairseq lines) to FILE instead of stdout, atomically",
        metavar="FILE",
        not_in=("interactive", "tune"),
    )
    output_format: str | None = setting(
        None,
        "text: one detokenized summary per input line, in input order (--nbest lines each); fairseq: "
        "S-/T-/H-/D-/P- lines in batch order (default: text with --input, fairseq for a data-bin split)",
        choices=["text", "fairseq"],
        not_in=("tune",),
    )
    num_shards: int = setting(
        1,
        "split the examples into N contiguous shards and generate only --shard-id's (as fairseq)",
        type=int,
        metavar="N",
        bounds=Bounds(1, 65536),
        not_in=("interactive", "tune"),
    )
    shard_id: int = setting(
        0,
        "the shard to generate, 0-based",
        type=int,
        metavar="ID",
        bounds=Bounds(0, 65535),
        not_in=("interactive", "tune"),
    )


logger = logging.getLogger("seqtrain.generate")


def check_folder_writable(folder: str, flag: str) -> None:
    """Prove a file can be written in `folder`, or, when it is missing, that it can be made (its nearest existing
    parent is a writable folder), or raise one line naming `flag`. Nothing is left behind: a refused or
    interrupted run leaves no empty folder (the writes at the end make it)."""
    parent = os.path.abspath(folder)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise SeqtrainError(
            f"{flag} {folder}: cannot write there ({parent} is not a folder); give a writable folder"
        )
    try:
        if parent == os.path.abspath(folder):
            fd, tmp = tempfile.mkstemp(prefix=".seqtrain-write-check.", dir=folder)
            os.close(fd)
            os.unlink(tmp)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".seqtrain-write-check.", dir=parent))
    except OSError as e:
        raise SeqtrainError(
            f"{flag} {folder}: cannot write there ({e.strerror}); give a writable folder"
        ) from None


def check_file_writable(path: str, flag: str, missing_ok: bool = False) -> None:
    """`path` can be written by seqtrain.fileio's rule: not a folder; a regular or missing file's folder (a
    link's target's) exists (or, with `missing_ok`, can be made) and is writable; a device or FIFO is writable
    (not opened now: a FIFO's reader would see the end of its input)."""
    try:
        target = output_target(path)
    except SeqtrainError as e:
        raise SeqtrainError(f"{flag} {e}") from None
    except OSError as e:
        raise SeqtrainError(f"{flag} {path}: cannot write there ({e.strerror})") from None
    if target.in_place:
        if target.fd is None and not os.access(target.where, os.W_OK):
            raise SeqtrainError(f"{flag} {path}: cannot write there (Permission denied)")
        return
    folder = os.path.dirname(target.where)
    if not os.path.isdir(folder) and not missing_ok:
        raise SeqtrainError(f"{flag} {path}: folder {folder} does not exist; create it first")
    check_folder_writable(folder, flag)


def fairseq_lines(
    loaded: Any,
    sid: int,
    sample: dict[str, Any],
    row: int,
    hypos: list[dict[str, Any]],
    nbest: int,
    post: Any,
) -> tuple[list[str], list[str], str | None, int]:
    """fairseq-generate's lines for one example: (lines, detokenized hypotheses best first, detokenized
    reference or None, generated tokens)."""
    src_dict, tgt_dict = loaded.lm.src_dict, loaded.lm.tgt_dict
    lines = [f"S-{sid}\t{src_dict.string(sample['net_input']['src_tokens'][row].cpu(), post)}"]
    target = None
    if sample.get("target") is not None:
        tgt_row = sample["target"][row]
        strip = loaded.strip  # fairseq strips the generator's eos (mBART's [tgt_lang]) from T- and H- lines
        target = loaded.tokenizer.decode(tgt_dict.string(tgt_row, extra_symbols_to_ignore=strip))
        lines.append(f"T-{sid}\t{tgt_dict.string(tgt_row, post, extra_symbols_to_ignore=strip)}")
    texts, ntok = [], 0
    for h in hypos[:nbest]:
        tokens = h["tokens"].cpu()
        detok = decode(loaded, tokens)
        texts.append(detok)
        ntok += len(tokens)
        score = repr(float(h["score"]) / math.log(2))  # fairseq prints base-2 scores as Python floats
        lines.append(f"H-{sid}\t{score}\t{tgt_dict.string(tokens, post, loaded.strip)}")
        lines.append(f"D-{sid}\t{score}\t{detok}")
        pos = (h["positional_scores"].float().cpu() / math.log(2)).tolist()
        lines.append(f"P-{sid}\t" + " ".join(f"{x:.4f}" for x in pos))
    return lines, texts, target, ntok


class Progress:
    """Sentences done: a tqdm bar on stderr (sentences, sentences/s) when the log format is tqdm (the default on
    a terminal, as fairseq), a log line every `interval` batches with --log-format simple/json, nothing with
    --no-progress-bar or --log-format none."""

    def __init__(self, total: int, log_format: str | None, no_bar: bool, interval: int, enabled: bool = True):
        fmt = log_format or ("tqdm" if sys.stderr.isatty() else "simple")
        self.total, self.done, self.batches, self.interval = total, 0, 0, max(interval, 1)
        self.t0 = time.perf_counter()
        self.bar = None
        self.log = enabled and not no_bar and fmt in ("simple", "json")
        if enabled and not no_bar and fmt == "tqdm":
            self.bar = tqdm(total=total, unit="sentences", file=sys.stderr, dynamic_ncols=True, leave=False)

    def update(self, n: int) -> None:
        self.done += n
        self.batches += 1
        if self.bar is not None:
            self.bar.update(n)
        elif self.log and self.batches % self.interval == 0:
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            logger.info(f"generated {self.done}/{self.total} sentences ({rate:.2f} sentences/s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def write_out(out: TextIO, lines: list[str]) -> None:
    """Lines to `out` (stdout), flushed; an OS error names it (a full disk behind `> file` said only "No space
    left on device")."""
    try:
        out.writelines(x + "\n" for x in lines)
        out.flush()
    except OSError as e:
        name = "stdout" if out is sys.stdout else str(getattr(out, "name", "the output"))
        raise OSError(e.errno, e.strerror or str(e), name) from None
