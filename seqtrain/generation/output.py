"""Where generation writes: output paths checked before any work, result files published together (whole or not
at all), fairseq's S-/T-/H-/D-/P- lines, and the progress display."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import tempfile
import time
from typing import Any

from tqdm import tqdm

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import publish
from seqtrain.generation.runner import decode

logger = logging.getLogger("seqtrain.generate")


def check_folder_writable(folder: str, flag: str) -> None:
    """Create `folder` if needed and prove a file can be written in it, or raise one line naming `flag`."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".seqtrain-write-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise SeqtrainError(
            f"{flag} {folder}: cannot write there ({e.strerror}); give a writable folder"
        ) from None


def check_file_writable(path: str, flag: str) -> None:
    """`path` can be created or replaced: its folder exists and is writable, and it is not a folder."""
    if os.path.isdir(path):
        raise SeqtrainError(f"{flag} {path}: is a folder; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SeqtrainError(f"{flag} {path}: folder {folder} does not exist; create it first")
    check_folder_writable(folder, flag)


def write_files(files: dict[str, str]) -> None:
    """Write every {path: text} to a temporary file next to it, then rename them all into place: when a write
    fails (full disk...), no file is replaced and the temporaries are removed."""
    done: list[tuple[str, str]] = []
    try:
        for path, text in files.items():
            folder = os.path.dirname(os.path.abspath(path))
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
            done.append((tmp, path))
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise SeqtrainError(
                    f"{path}: cannot write ({e.strerror}); no result file was written"
                ) from None
    except BaseException:
        for tmp, _ in done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for tmp, path in done:
        publish(tmp, path)


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
        target = loaded.tokenizer.decode(tgt_dict.string(tgt_row))
        lines.append(f"T-{sid}\t{tgt_dict.string(tgt_row, post)}")
    texts, ntok = [], 0
    for h in hypos[:nbest]:
        tokens = h["tokens"].cpu()
        detok = decode(loaded, tokens)
        texts.append(detok)
        ntok += len(tokens)
        score = repr(float(h["score"]) / math.log(2))  # fairseq prints base-2 scores as Python floats
        lines.append(f"H-{sid}\t{score}\t{tgt_dict.string(tokens, post)}")
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
