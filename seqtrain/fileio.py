"""Output files: how every file the tools write reaches the path it is given.

`output_target(path)` decides, from what is at the path now, and every writer follows it (`Output`,
`atomic_write`, `publish`, `link_or_copy`):
- nothing, or a regular file: written to a temporary file in the same folder, flushed, fsynced and renamed over
  the path (atomic on POSIX within one filesystem), and the folder fsynced, so the rename itself survives a
  crash: a file that looks valid is never half-written, and a failed write leaves the old file as it was;
- a symbolic link: followed; when its target is a regular file or missing, the target is written as above (the
  temporary file in the target's folder) and the link stays a link;
- a device, FIFO or socket, or a link to one (/dev/null, a named pipe, `>(gzip > x.gz)`, /proc/self/fd/1 when
  that is a pipe): written in place, as a shell redirection would (opened for writing, never replaced, no
  fsync); opening a FIFO waits for its reader, as the shell does;
- a link to a descriptor of this process (/dev/stdout, /dev/fd/N, /proc/self/fd/N), whatever it is open on:
  written through that descriptor (a duplicate of it), as the process's own writes to it are, at its offset and
  with its flags; a regular file is not replaced (its redirection opened it: replacing it would cut it off from
  the descriptor and lose what `>>` kept). Another process's /proc/PID/fd/N to a regular file is appended to;
- a folder: a one-line SeqtrainError naming it.
seqtrain-preprocess builds its data-bin in a hidden work folder and moves the files out of it one by one through
`publish`; a Hugging Face export writes each file of its folder through `atomic_write`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from seqtrain.errors import SeqtrainError


def file_kind(mode: int) -> str:
    """What an st_mode is, in words: "a FIFO", "a folder", ... ("a regular file" for one)."""
    return {
        stat.S_IFREG: "a regular file",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFDIR: "a folder",
        stat.S_IFLNK: "a symbolic link",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
    }.get(stat.S_IFMT(mode), "not a regular file")


def _default_file_mode() -> int:
    # mkstemp creates 0600 files; published files should get the usual 0666 & ~umask, like open() gives
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


DEFAULT_FILE_MODE = _default_file_mode()

# a file descriptor's entry in /proc, which /dev/stdout, /dev/stderr and /dev/fd/N lead to
_FD_LINK = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd/(\d+)")


@dataclasses.dataclass(frozen=True)
class OutputTarget:
    """Where the bytes for `path` go: replaced atomically (`where` is then the real path of the regular or
    missing file, symbolic links followed), or written in place (`in_place`: a device, FIFO or socket at
    `where`; this process's descriptor `fd`; another process's regular file, with `append`)."""

    path: str
    where: str
    in_place: bool = False
    append: bool = False
    fd: int | None = None


def _fd_link(path: str) -> tuple[int, int] | None:
    """(pid, fd) of the /proc/PID/fd/N entry that `path` leads to, link by link (/dev/stdout and /dev/fd/1
    lead to this process's /proc/PID/fd/1), or None."""
    p = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))  # /proc/self -> /proc/PID
        m = _FD_LINK.fullmatch(p)
        if m:
            return int(m.group(1)), int(m.group(2))
        if not os.path.islink(p):
            return None
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return None


def output_target(path: str | os.PathLike) -> OutputTarget:
    """How an output at `path` is written (see the module docstring). A folder at the path is a SeqtrainError;
    a path that cannot be looked at (a loop of links, a file where a folder should be) the OSError."""
    path = os.fspath(path)
    if not path:
        raise SeqtrainError("an output path is empty; give a file name")
    try:
        st: os.stat_result | None = os.stat(path)  # follows links
    except FileNotFoundError:
        st = None  # nothing there, or a link to nothing: written as a new file
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise SeqtrainError(f"{path}: is a folder; give a file name")
    link = _fd_link(path)
    if link is not None and link[0] == os.getpid():
        if st is None:
            raise SeqtrainError(f"{path}: file descriptor {link[1]} is not open; give a file name")
        return OutputTarget(path, path, in_place=True, fd=link[1])
    if st is not None and not stat.S_ISREG(st.st_mode):
        return OutputTarget(path, path, in_place=True)
    if link is not None and st is not None:
        return OutputTarget(path, path, in_place=True, append=True)
    return OutputTarget(path, os.path.realpath(path))


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _named(e: OSError, path: str) -> OSError:
    """`e` naming `path` when it names no file (a failed write or flush), so its one line says which output."""
    if e.filename is None:
        e.filename = path
    return e


def _temp_next_to(where: str, suffix: str) -> tuple[int, str]:
    """A new temporary file `.NAME.XXXX<suffix>` in the folder of `where` (created when missing)."""
    folder = os.path.dirname(where)
    try:
        os.makedirs(folder, exist_ok=True)
        return tempfile.mkstemp(prefix="." + os.path.basename(where) + ".", suffix=suffix, dir=folder)
    except OSError as e:
        raise _named(e, where) from None


def _open_in_place(target: OutputTarget) -> int:
    try:
        if target.fd is not None:
            for stream in (sys.stdout, sys.stderr):  # what this process wrote to it before comes first
                with contextlib.suppress(Exception):
                    stream.flush()
            return os.dup(target.fd)
        flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if target.append else 0)
        # no O_CREAT: it exists; no O_TRUNC: devices and FIFOs have no length
        return os.open(target.where, flags)
    except OSError as e:
        raise _named(e, target.path) from None


def _rename_into_place(tmp: str, target: OutputTarget) -> None:
    os.chmod(tmp, DEFAULT_FILE_MODE)
    os.replace(tmp, target.where)
    fsync_dir(os.path.dirname(target.where))


class Output:
    """One output file being written by the rule of `output_target`: write to `file`, then `commit()` (or
    `finish()` now and `place()` later, to publish several files together); `discard()` on failure leaves the
    path as it was (a stream keeps what it was already sent)."""

    def __init__(self, path: str | os.PathLike, mode: str = "wb", encoding: str | None = None):
        self.path = os.fspath(path)
        self.target = output_target(self.path)
        self.tmp: str | None = None
        if self.target.in_place:
            fd = _open_in_place(self.target)
        else:
            fd, self.tmp = _temp_next_to(self.target.where, ".tmp")
        try:
            self.file: IO = os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None)
        except BaseException:
            os.close(fd)
            self.discard()
            raise
        self._finished = False

    def finish(self) -> None:
        """Flush and close the file; a temporary file is also fsynced (a pipe or a device is not)."""
        if self._finished:
            return
        try:
            self.file.flush()
            if not self.target.in_place or stat.S_ISREG(os.fstat(self.file.fileno()).st_mode):
                os.fsync(self.file.fileno())
        except OSError as e:
            raise _named(e, self.path) from None
        finally:
            with contextlib.suppress(OSError):
                self.file.close()
        self._finished = True

    def place(self) -> None:
        """Rename the finished temporary file over the target (nothing to do for a stream)."""
        if self.tmp is not None:
            _rename_into_place(self.tmp, self.target)
            self.tmp = None

    def commit(self) -> None:
        self.finish()
        self.place()

    def discard(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.file.close()
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Yield a file object for the output `path` (see `output_target`); on clean exit a regular file replaces
    the path's file atomically, on error the path is untouched. An OSError of the write names the path."""
    out = Output(path, mode, encoding)
    try:
        yield out.file
        out.commit()
    except BaseException as e:
        out.discard()
        if isinstance(e, OSError):
            _named(e, out.path)
        raise


def publish(tmp: str, path: str | os.PathLike) -> None:
    """Move the finished file `tmp` to the output `path` by the rule of `output_target`: renamed over the
    target (copied into a temporary file in the target's folder first when that is on another filesystem), or
    copied into a stream; `tmp` is gone afterwards."""
    target = output_target(path)
    if not target.in_place:
        try:
            _rename_into_place(tmp, target)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:  # a link to another filesystem: copy below
                raise
    with open(tmp, "rb") as src, atomic_write(target.path, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    os.unlink(tmp)


def link_or_copy(src: str, dst: str | os.PathLike) -> None:
    """Make the output `dst` hold the bytes of the file `src`: a hard link when the filesystem allows, made
    under a temporary name and renamed over the target, else a copy by `atomic_write` (also into a stream)."""
    target = output_target(dst)
    if not target.in_place:
        fd, tmp = _temp_next_to(target.where, ".link")
        os.close(fd)
        os.unlink(tmp)
        try:
            os.link(src, tmp)
            os.replace(tmp, target.where)
            fsync_dir(os.path.dirname(target.where))
            return
        except OSError:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    with open(src, "rb") as fin, atomic_write(target.path, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 24)


# ---- reading small JSON inputs (config files, JSON lines, Hugging Face settings) within bounds

MAX_NESTING = 100  # levels of [ and { in one JSON value; flag values and examples need a handful
MAX_INT_DIGITS = 100  # digits of one integer: every numeric setting's range ends far below 10^100
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def json_nesting(text: str) -> int:
    """How deep [ and { nest in the JSON `text` (brackets inside strings do not count), without parsing it:
    json.loads recurses once per level and ends in a RecursionError past Python's recursion limit."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return 0  # cannot reach the cap: the common case costs two counts
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", _JSON_STRING.sub('""', text)):
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class JSONBoundsError(ValueError):
    """JSON text past MAX_NESTING or MAX_INT_DIGITS; `msg` says which (no line: the callers name theirs)."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONBoundsError(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONBoundsError(f"{key!r} is given twice in one object")
        out[key] = value
    return out


def loads_bounded(text: str, unique_keys: bool = False) -> Any:
    """json.loads with the nesting and integer sizes bounded before anything is built: raises
    JSONBoundsError (a ValueError) past MAX_NESTING levels or for an integer of more than MAX_INT_DIGITS
    digits (Python's own int-str limit raises a bare ValueError at 4,300), and with `unique_keys` for a key
    given twice in one object (json.loads keeps the last); json.JSONDecodeError as json.loads does."""
    if json_nesting(text) > MAX_NESTING:
        raise JSONBoundsError(f"nested more than {MAX_NESTING} levels deep")
    return json.loads(text, parse_int=_bounded_int, object_pairs_hook=_unique_pairs if unique_keys else None)
