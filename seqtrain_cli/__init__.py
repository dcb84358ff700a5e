"""seqtrain's console scripts (seqtrain-preprocess, -train, -generate, ...), each a module with `cli_main`.

A Ctrl-C or SIGTERM while a console script is still importing (torch and the tokenizer libraries: seconds on a
loaded machine) used to end in a KeyboardInterrupt traceback from inside an import (issue 40). So the first
import of this package by a console script (or `python -m seqtrain_cli.X`) installs start-up handlers that print
the one line the script would and exit 130 / 143 (nothing has been written yet); `run_cli` hands over to its own
handling once it runs (seqtrain_cli._main.run_cli). Imported from Python (tests, notebooks), nothing changes."""

from __future__ import annotations

import os
import signal
import sys


def _prog() -> str:
    """The console script's name: seqtrain-X, also for `python -m seqtrain_cli.X` (seqtrain while -m is still
    locating the module)."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    if name.startswith("seqtrain-"):
        return name
    if name.endswith(".py") and name != "__init__.py":
        return "seqtrain-" + name[:-3].replace("_", "-")
    return "seqtrain"


def _start_up_signal(signum: int, frame: object) -> None:
    what = (
        "interrupted"
        if signum == signal.SIGINT
        else "stopped by SIGTERM before any work; nothing was written"
    )
    try:
        os.write(2, f"{_prog()}: {what}\n".encode())
    finally:
        os._exit(128 + signum)  # nothing to clean up yet; no traceback from the import under way


def _started_as_console_script() -> bool:
    # a console script imports this package with its own path in argv[0]; `python -m` with "-m" there while it
    # locates the module (Python's documented behaviour)
    arg0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(arg0).startswith("seqtrain-") or arg0 == "-m"


if _started_as_console_script():
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _start_up_signal)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _start_up_signal)
