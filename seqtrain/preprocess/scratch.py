"""Hidden work folders inside an output folder (seqtrain-preprocess builds its data-bin in one, then renames
the files out of it): removed when the run ends, also on SIGTERM, and left-overs of killed runs (SIGKILL, power
loss) are removed by the next run.

A work folder is named `.{tag}-{pid}@{host}.XXXXXXXX`: a later run removes one only if it was made on the same
host by a process that no longer exists, so a run still going in the same folder keeps its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from types import FrameType

from seqtrain.errors import SeqtrainError, Stopped

logger = logging.getLogger("seqtrain.scratch")  # the name log lines have always shown

_STOP = (signal.SIGTERM, signal.SIGINT)


def _pattern(tag: str) -> re.Pattern:
    return re.compile(rf"^\.{re.escape(tag)}-(\d+)@(.+)\.[A-Za-z0-9_]{{8}}$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def remove_stale(folder: str, tag: str) -> list[str]:
    """Remove the work folders in `folder` left by dead processes of this host; returns their paths."""
    host, pattern, removed = socket.gethostname(), _pattern(tag), []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            m = pattern.match(name)
            path = os.path.join(folder, name)
            if not m or m.group(2) != host or _alive(int(m.group(1))) or not os.path.isdir(path):
                continue
            shutil.rmtree(path, ignore_errors=True)
            logger.warning(f"removed {path}, left by a run that was killed")
            removed.append(path)
    return removed


def _terminate(signum: int, frame: FrameType | None) -> None:
    # unwinds through the `finally` blocks, which remove the work folder; exit code 143
    raise Stopped(signum, f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT that arrive inside the block act at its end, through the handlers there were before
    it, so what it does (moving finished files into place) is done whole. (Holding the signals back with a
    mask would not do: Python runs a handler in the main thread whichever thread the signal was delivered to.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in _STOP}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if arrived:
            signal.raise_signal(arrived[0])  # now, through the handler restored above


@contextlib.contextmanager
def work_folder(folder: str, tag: str) -> Iterator[str]:
    """A fresh work folder in `folder` (same filesystem: its files can be renamed into place), removed at the
    end, on an error, on Ctrl-C and on SIGTERM (which raises seqtrain.errors.Stopped: exit code 143)."""
    remove_stale(folder, tag)
    main = threading.current_thread() is threading.main_thread()
    # The handler is in place before the folder exists, and a signal that arrives while it is being made acts
    # once `path` is known, inside the try below (a SIGTERM between the two used to leave the folder behind).
    previous = signal.signal(signal.SIGTERM, _terminate) if main else None
    path: str | None = None
    try:
        with signals_deferred():
            try:
                path = tempfile.mkdtemp(prefix=f".{tag}-{os.getpid()}@{socket.gethostname()}.", dir=folder)
            except OSError as e:
                raise SeqtrainError(
                    f"{folder}: cannot write there ({e.strerror}); choose a writable folder"
                ) from None
        yield path
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        if main:
            signal.signal(signal.SIGTERM, previous)
