"""Shared wrapper for the console scripts: user errors print one line and exit 1 (traceback only with --debug);
command-line syntax errors (seqtrain.flags.parsers.UsageError, raised by seqtrain's ArgumentParser) exit 2.

Operating-system errors that reach this wrapper (a missing folder, a read-only destination, a full disk) are user
errors too: one line naming the path and what to do about it, exit 1."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from seqtrain.errors import SeqtrainError, Stopped
from seqtrain.flags.parsers import UsageError

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


def run_cli(prog: str, main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        rc = main(argv)
    except Stopped as e:  # SIGTERM / SIGINT, acted on: one line saying what was kept, 128 + the signal
        print(f"{prog}: {e.message}", file=sys.stderr)
        sys.exit(e.code)
    except (SeqtrainError, OSError) as e:
        if debug:
            raise
        line = os_error_line(e) if isinstance(e, OSError) else str(e)
        print(f"{prog}: error: {line}", file=sys.stderr)
        sys.exit(2 if isinstance(e, UsageError) else 1)
    except BaseException as e:
        # Ctrl-C, also when library code turned it into another error while handling it (torch.save does)
        if not interrupted(e):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc or 0)


def interrupted(e: BaseException | None) -> bool:
    """`e` is a KeyboardInterrupt or was raised while handling one."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__context__
    return False
