"""Shared wrapper for the console scripts: user errors print one line and exit 1 (traceback only with --debug)."""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Iterator, List, Optional

from seqtrain.errors import SeqtrainError


class UsageError(SeqtrainError):
    """A command-line syntax error found by argparse (exit code 2, as argparse's own)."""


@contextlib.contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """argparse prints its usage block before the error; make it one line like every other error (the usage is
    what --help is for). Only while a CLI's main runs, so library users of argparse are not affected."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> None:
        raise UsageError(f"{message} (see --help)")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def run_cli(prog: str, main: Callable[[List[str]], Optional[int]], argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        with one_line_usage_errors():
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
