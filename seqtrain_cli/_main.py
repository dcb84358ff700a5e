"""Shared wrapper for the console scripts: user errors print one line and exit 1 (traceback only with --debug);
command-line syntax errors (seqtrain.flags.parsers.UsageError, raised by seqtrain's ArgumentParser) exit 2.

Operating-system errors that reach this wrapper (a missing folder, a read-only destination, a full disk) are user
errors too: one line naming the path and what to do about it, exit 1."""

from __future__ import annotations

import _thread
import errno
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from seqtrain.errors import SeqtrainError, Stopped
from seqtrain.flags.parsers import UsageError
from seqtrain_cli import _start_up_signal

REMEDIES = {
    errno.ENOENT: "check the path (create the folder first if it is an output)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "give a file, not a folder",
    errno.EACCES: "fix its permissions or choose another path",
    errno.EPERM: "fix its permissions or choose another path",
    errno.EROFS: "the filesystem is read-only; choose another path",
    errno.ENOSPC: "the disk is full; free space and rerun",
    errno.EDQUOT: "the disk quota is exceeded; free space and rerun",
    errno.EEXIST: "it is in the way; remove it or choose another path",
}


def os_error_line(e: OSError) -> str:
    """`e` as one line: the path(s), the system's reason and a remedy."""
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    reason = e.strerror or str(e)
    remedy = REMEDIES.get(e.errno or 0, "")
    text = f"{paths}: {reason}" if paths else reason
    return f"{text}; {remedy}" if remedy else text


def _interrupt_main_soon() -> None:
    # From another thread, a moment later: interrupt_main() called on the main thread itself would raise the
    # KeyboardInterrupt inside this very hook, where Python prints it as "Exception ignored" and drops it.
    timer = threading.Timer(0.01, _thread.interrupt_main)
    timer.daemon = True
    timer.start()


def _interrupt_later(unraisable: object, hook: Callable[[object], None]) -> None:
    """sys.unraisablehook: a Ctrl-C that lands in a __del__ method or a dying thread cannot be raised there, and
    Python would print a traceback and drop it; deliver it to the main thread again instead (nothing happens
    once SIGINT is ignored, i.e. when the run is already ending after a signal)."""
    try:
        if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
            _interrupt_main_soon()
        else:
            hook(unraisable)
    except KeyboardInterrupt:  # a further Ctrl-C landed inside this hook: deliver it the same way
        _interrupt_main_soon()


def _interrupt_once(signum: int, frame: object) -> None:
    """The console scripts' Ctrl-C: Python's KeyboardInterrupt, with SIGINT ignored from that moment on. A
    second Ctrl-C close behind the first (0.001 s in tests/e2e/test_generate_output.py) otherwise landed in the
    `except` clause before it could ignore further ones, and printed a traceback with exit code -2. Training's
    loop installs its own handlers (seqtrain.train.stop_signals) over this one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _stopped_before_work(signum: int, frame: object) -> None:
    raise Stopped(signum, f"stopped by {signal.Signals(signum).name} before any work; nothing was written")


def run_cli(
    prog: str,
    main: Callable[[list[str]], int | None],
    argv: list[str] | None = None,
    stop_early: bool = False,
) -> None:
    """Run `main(argv)` as the program `prog`. `stop_early`: for programs whose work installs its own SIGTERM
    handler late (preprocessing, scoring), a SIGTERM before then is one line and 143 as well, not a silent kill
    (training keeps SIGTERM's default until its loop starts: a second one must kill, seqtrain.train.stop_signals)."""
    own_process = argv is None  # the console script itself, not a call from Python (tests, notebooks)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        _run(prog, main, argv, debug)
        return
    # the package's start-up handlers (seqtrain_cli/__init__.py) stand for Python's defaults and end here
    term = signal.getsignal(signal.SIGTERM)
    if stop_early and own_process and term in (signal.SIG_DFL, _start_up_signal):
        signal.signal(signal.SIGTERM, _stopped_before_work)
    elif own_process and term is _start_up_signal:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    if own_process and previous in (signal.default_int_handler, _start_up_signal):
        signal.signal(signal.SIGINT, _interrupt_once)
    sys.unraisablehook = functools.partial(_interrupt_later, hook=hook)
    try:
        _run(prog, main, argv, debug)
    finally:
        sys.unraisablehook = hook
        # after a signal the console script ends with further ones ignored (through the interpreter's shutdown,
        # where one would print a traceback); a call from Python gets its handler back whatever happened
        if not own_process:
            signal.signal(signal.SIGINT, previous)


def _run(prog: str, main: Callable[[list[str]], int | None], argv: list[str], debug: bool) -> None:
    try:
        rc = main(argv)
    except Stopped as e:  # SIGTERM / SIGINT, acted on: one line saying what was kept, 128 + the signal
        _ignore_further_interrupts()
        print(f"{prog}: {e.message}", file=sys.stderr)
        sys.exit(e.code)
    except (SeqtrainError, OSError) as e:
        if debug:
            raise
        line = os_error_line(e) if isinstance(e, OSError) else str(e)
        print(f"{prog}: error: {line}", file=sys.stderr)
        torchrun_error_file(f"{prog}: error: {line}")
        sys.exit(2 if isinstance(e, UsageError) else 1)
    except BaseException as e:
        # Ctrl-C, also when library code turned it into another error while handling it (torch.save does)
        if not interrupted(e):
            raise
        _ignore_further_interrupts()
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc or 0)


def torchrun_error_file(line: str) -> None:
    """Under torchrun, the error line in the file its agent reads back (TORCHELASTIC_ERROR_FILE, the format of
    torch.distributed.elastic's @record): its failure report then names this line as each rank's error and the
    root cause, instead of "To enable traceback see: ...". The report itself (and the launcher's own traceback)
    is torchrun's, printed for any rank that exits non-zero; a rank cannot end a failed job without it but by
    exiting 0, which would hide the failure from the shell (issue 40)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    record = {
        "message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}
    }
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f)
    except OSError:
        pass  # the report then says what it says without it; the line is on stderr already


def _ignore_further_interrupts() -> None:
    """The run is ending after a signal: a further Ctrl-C changes nothing (and prints no traceback)."""
    if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(e: BaseException | None) -> bool:
    """`e` is a KeyboardInterrupt or was raised while handling one."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False
