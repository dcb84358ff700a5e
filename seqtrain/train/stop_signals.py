"""Graceful stop: SIGTERM / SIGINT ask training to finish the current update, save, and exit.

A job scheduler (SLURM, Kubernetes, a spot-instance reclaim) sends SIGTERM and waits a grace period before it
sends SIGKILL; Ctrl-C sends SIGINT. While `GracefulStop` is active, the first of either signal only records that
a stop was asked for; the training loop notices it after the update in progress, writes checkpoint_last.pt with
its exact position and returns `exit_code` (128 + the signal number, the shell's convention for "ended by this
signal": 143 for SIGTERM, 130 for SIGINT), so a wrapper script can tell "stopped, resumable" from "finished" (0)
and "failed" (1). A second signal of the same kind gets the handler that was there before (Ctrl-C twice raises
KeyboardInterrupt at once; a second SIGTERM kills the process): an impatient user is never stuck.

The handler itself only stores the signal number: signal handlers run between bytecodes of the main thread,
where logging or file I/O could interleave with what that thread was doing.


Child processes leave both signals to this one: seqtrain.workers starts them so.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from seqtrain.workers import STOP_SIGNALS


class GracefulStop:
    """Context manager; `signum` is the first stop signal received while active (None if none)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum) if self.signum is not None else 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        # the next signal of this kind does what it did before we were installed
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def __enter__(self) -> GracefulStop:
        # Python only lets the main thread install handlers; elsewhere (a spawned worker thread) stay passive.
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                if signal.getsignal(s) == signal.SIG_IGN:
                    continue  # ignored on purpose (e.g. SIGINT of a shell background job): leave it so
                self._previous[s] = signal.getsignal(s)
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
