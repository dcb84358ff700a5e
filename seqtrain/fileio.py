"""Atomic file writes: a file that looks valid is never half-written.

Write to a temporary file in the destination folder, flush, fsync, then rename over the target (rename is atomic
on POSIX within one filesystem), and fsync the folder so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; published files should get the usual 0666 & ~umask, like open() gives
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


DEFAULT_FILE_MODE = _default_file_mode()


def publish(tmp: str, path: str) -> None:
    """Give `tmp` normal permissions and rename it over `path` (atomic on POSIX), then fsync the folder."""
    os.chmod(tmp, DEFAULT_FILE_MODE)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Yield a file object; on clean exit it replaces `path` atomically, on error `path` is untouched."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
