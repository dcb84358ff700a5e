"""Logging: meters, progress bars, TensorBoard, and the one log line layout every CLI uses."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq's layout
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def formatter() -> logging.Formatter:
    return logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT)


class LogFileHandler(logging.FileHandler):
    """--log-file: a write that fails (a full disk, a device that refuses) stops the file's logging with one
    warning on the other handlers naming the file, instead of logging's "--- Logging error ---" traceback for
    every record, and a bare "No space left on device" from the final flush. The run goes on: losing log
    lines is no reason to lose its work."""

    failed: OSError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self._fail(error)
        else:
            super().handleError(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            self._fail(e)

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:
            self._fail(e)

    def _fail(self, error: OSError) -> None:
        if self.failed is not None:
            return
        self.failed = error
        logging.getLogger("seqtrain.logging").warning(
            f"--log-file {self.baseFilename}: cannot write ({error.strerror or error}); it gets no more log "
            "lines (they still go to the console)"
        )


def setup_logging(
    stream: TextIO | None = None, level: int = logging.INFO, log_file: str | None = None
) -> logging.Handler | None:
    """Log to `stream` (default stderr) in LOG_FORMAT, unless the root logger already has a handler; with
    `log_file`, also to that file: the file handler is returned, so the caller can remove it when done."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(formatter())
        root.addHandler(handler)
    root.setLevel(level)
    if log_file is None:
        return None
    file_handler = LogFileHandler(log_file)
    file_handler.setFormatter(formatter())
    root.addHandler(file_handler)
    return file_handler
