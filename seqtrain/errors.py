"""User-facing errors: one clear line naming the file, line or flag; the CLIs print them without a traceback."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class SeqtrainError(Exception):
    """An error caused by the user's input (files, flags, checkpoints). Message is one line, self-explaining."""


class Stopped(SystemExit):
    """A run that a signal (SIGTERM, SIGINT) stopped cleanly: exits with 128 + the signal number (the shell's
    convention: 143, 130); `message` is the one line the CLIs print, saying what was kept."""

    def __init__(self, signum: int, message: str):
        super().__init__(128 + signum)
        self.signum, self.message = signum, message


@contextlib.contextmanager
def stop_on_sigterm(kept: str = "nothing was written") -> Iterator[None]:
    """SIGTERM inside the block ends the program at once with one line and 143 (Stopped: `stopped by SIGTERM;
    <kept>`), as Ctrl-C does with `interrupted` and 130; SIGTERM's default action ended it without a word. For
    the programs that write their outputs at the end, whole or not at all (seqtrain-score, -eval, -generate,
    -tune) and -interactive. Outside the main thread (a library caller's worker) signals cannot be handled:
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name}" + (f"; {kept}" if kept else ""))

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
