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

Child processes (DataLoader workers, preprocessing pools) leave both signals to the main process: a scheduler's
SIGTERM and a terminal's Ctrl-C go to the whole process group, and a worker that died of them took the run down
with it (`DataLoader worker (pid N) is killed by signal: Terminated`) before the main process could save. Such
children are started by `child_context` / `child_pool`: with the signals held back while they are forked, ignoring
them from their first instruction on (`ignore_stop_signals`), and ended by SIGKILL when their parent terminates
them (SIGTERM, what multiprocessing sends, would now be ignored).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context as mpc
import multiprocessing.pool
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def ignore_stop_signals() -> None:
    """In a child process: ignore SIGTERM and SIGINT (the main process acts on them), and let through the ones
    `stop_signals_held` held back while it was forked (ignored, a pending one is dropped)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back from the calling thread while it forks children: a child inherits the mask,
    so a signal sent to the group before the child ignores them stays pending there (and is dropped); in this
    process it is delivered when the block ends (or at once to another thread of it)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _KilledOnTerminate:
    """A multiprocessing process whose terminate() sends SIGKILL: it ignores SIGTERM (`ignore_stop_signals`),
    and whoever terminates it (Pool.terminate, a DataLoader's shutdown) must not wait on it for ever."""

    def terminate(self) -> None:
        self.kill()  # type: ignore[attr-defined]


class _ForkChild(_KilledOnTerminate, mpc.ForkProcess):
    pass


class _SpawnChild(_KilledOnTerminate, mpc.SpawnProcess):
    pass


class _ForkServerChild(_KilledOnTerminate, mpc.ForkServerProcess):
    pass


class _ForkChildContext(mpc.ForkContext):
    Process = _ForkChild


class _SpawnChildContext(mpc.SpawnContext):
    Process = _SpawnChild


class _ForkServerChildContext(mpc.ForkServerContext):
    Process = _ForkServerChild


_CHILD_CONTEXTS = {
    "fork": _ForkChildContext,
    "spawn": _SpawnChildContext,
    "forkserver": _ForkServerChildContext,
}


def child_context(method: str | None = None) -> mpc.BaseContext:
    """A multiprocessing context for children that ignore SIGTERM: start method `method` (default: this
    Python's), its processes' terminate() sends SIGKILL."""
    return _CHILD_CONTEXTS[method or multiprocessing.get_start_method()]()


def _child_init(initializer: Callable[..., Any] | None, initargs: tuple) -> None:
    ignore_stop_signals()
    if initializer is not None:
        initializer(*initargs)


def child_pool(
    processes: int,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple = (),
    method: str | None = None,
) -> multiprocessing.pool.Pool:
    """A worker Pool whose workers ignore SIGTERM and SIGINT (then run `initializer`), forked with the signals
    held back, and ended by SIGKILL on terminate() (also when a `with` block ends)."""
    with stop_signals_held():
        return child_context(method).Pool(processes, _child_init, (initializer, initargs))


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
