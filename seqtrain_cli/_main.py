"""Shared wrapper for the console scripts: user errors print one line and exit 1 (traceback only with --debug);
command-line syntax errors (seqtrain.options.UsageError, raised by seqtrain's ArgumentParser) exit 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

from seqtrain.errors import SeqtrainError
from seqtrain.options import UsageError


def run_cli(prog: str, main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        rc = main(argv)
    except SeqtrainError as e:
        if debug:
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, UsageError) else 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc or 0)
