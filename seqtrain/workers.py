"""Child processes (DataLoader workers, preprocessing pools, dictionary counting) leave SIGTERM and SIGINT to
the main process.

A scheduler's SIGTERM and a terminal's Ctrl-C go to the whole process group, and a worker that died of them took
the run down with it (`DataLoader worker (pid N) is killed by signal: Terminated`) before the main process could
save. Such children are started by `child_context` / `child_pool`: with the signals held back while they are
forked, ignoring them from their first instruction on (`ignore_stop_signals`), and ended by SIGKILL when their
parent terminates them (SIGTERM, what multiprocessing sends, would now be ignored). The main process acts on the
signals (seqtrain.train.stop_signals: finish the update, save, exit 143 / 130).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context as mpc
import multiprocessing.pool
import signal
from collections.abc import Callable, Iterator
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
