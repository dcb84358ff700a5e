"""Logging: meters, progress bars, TensorBoard, and the one log line layout every CLI uses."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq's layout
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def formatter() -> logging.Formatter:
    return logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT)


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
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(formatter())
    root.addHandler(file_handler)
    return file_handler
