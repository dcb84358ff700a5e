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

Two rules every program follows before it writes or reads anything (`check_outputs_apart`, `bounded_lines`):
- an output is never one of the run's inputs, nor another output of the run: files are compared by what they are
  (device and inode), so a relative path, `..`, a symbolic link or a hard link to an input counts as the input;
- a line of a text input is at most MAX_LINE_BYTES long: a file or device without line ends (`/dev/zero`, a
  3 GB file of one line) is refused at its first MAX_LINE_BYTES bytes, naming the file and line, instead of being
  read whole into memory.
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
from collections.abc import Iterator, Sequence
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
    """A new temporary file `.NAME.XXXX<suffix>` in the folder of `where` (created when missing). An OSError
    names `where`: the temporary name means nothing to whoever reads the error (a read-only folder)."""
    folder = os.path.dirname(where)
    try:
        os.makedirs(folder, exist_ok=True)
        return tempfile.mkstemp(prefix="." + os.path.basename(where) + ".", suffix=suffix, dir=folder)
    except OSError as e:
        e.filename = where
        raise


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


def write_files(files: dict[str, str]) -> None:
    """Write every {path: text} (UTF-8) by this module's rule, all or none (seqtrain-generate's result files,
    seqtrain-tune's, seqtrain-eval's --json and --html): the text of each regular output goes to
    a temporary file next to its target first, then streams (devices, FIFOs) are written, then the temporary
    files are renamed into place. When a write fails (full disk...), no file is replaced and the temporaries
    are removed."""
    targets = {path: output_target(path) for path in files}
    done: list[Output] = []
    try:
        for streams in (False, True):
            for path, text in files.items():
                if targets[path].in_place != streams:
                    continue
                try:
                    out = Output(path, "w", encoding="utf-8")
                    done.append(out)
                    out.file.write(text)
                    out.finish()
                except OSError as e:
                    raise SeqtrainError(
                        f"{path}: cannot write ({e.strerror}); no result file was written"
                    ) from None
    except BaseException:
        for out in done:
            out.discard()
        raise
    for out in done:
        out.place()


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


# ---- outputs apart from inputs


def _identity(path: str) -> tuple | None:
    """What `path` is, for comparing an output with an input: an existing file or folder by (kind, device,
    inode), so every spelling of it (relative, `..`, symbolic links, hard links) compares equal; a missing file
    by the path its links lead to; None for what is never replaced (a device, FIFO or socket)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("missing", os.path.realpath(path))
    except OSError:
        return None  # a loop of links, a file where a folder should be: the write itself says so
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return ("file" if stat.S_ISREG(st.st_mode) else "folder", st.st_dev, st.st_ino)
    return None


def folder_files(path: str | None) -> list[str]:
    """The regular files directly inside the folder `path` (a data-bin, a Hugging Face model folder), or
    [`path`] when it is no folder: the files an input folder stands for in `check_outputs_apart`."""
    if not path or not os.path.isdir(path):
        return [path] if path else []
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def check_outputs_apart(
    outputs: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, str | None]]
) -> None:
    """The one rule for every program's outputs: none of `outputs` ((flag, path) pairs; None: not asked) is one
    of the run's `inputs` (the same pairs; "-" is stdin; an input folder counts as itself, so an output folder
    that is it is refused; callers list the files of an input folder with `folder_files`) or another of the
    outputs. A one-line SeqtrainError names both flags and paths; checked before anything is read or written,
    so an input is never replaced (nor appended to, for a log file)."""
    seen: list[tuple[tuple, str, str]] = []
    for flag, path in inputs:
        if path and path != "-":
            key = _identity(path)
            if key is not None and key[0] != "missing":
                seen.append((key, flag, path))
    outs: list[tuple[tuple, str, str]] = []
    for flag, path in outputs:
        key = _identity(path) if path else None
        if key is None:
            continue
        kind = "folder" if key[0] == "folder" else "file"
        clash = next((s for s in seen if s[0] == key), None)
        if clash is not None:
            raise SeqtrainError(
                f"{flag} {path} is {clash[1]} {clash[2]} (the same {kind}): writing it would replace that input; "
                f"give {flag} another {kind}"
            )
        twin = next((o for o in outs if o[0] == key), None)
        if twin is not None:
            raise SeqtrainError(
                f"{twin[1]} {twin[2]} and {flag} {path} are the same {kind}: one output would replace the other; "
                f"give each its own {kind}"
            )
        outs.append((key, flag, path))


# ---- reading lines within a bound

MAX_LINE_BYTES = 16 << 20  # one line of text; a book-length document is about 1 MiB


def line_too_long(name: str, lineno: int, limit: int | None = None) -> SeqtrainError:
    """The one line for a text input whose line `lineno` runs past the bound (no line end within it)."""
    limit = MAX_LINE_BYTES if limit is None else limit
    return SeqtrainError(
        f"{name}:{lineno}: no line end within {limit >> 20} MiB ({limit:,} bytes); a text input holds one "
        "example per line (is this a text file?)"
    )


def bounded_lines(
    f: IO[bytes], name: str, first_lineno: int = 1, limit: int | None = None
) -> Iterator[bytes]:
    """The lines of the binary file `f`, each with its b"\\n" (the last maybe without), read one at a time with
    the bound MAX_LINE_BYTES (`limit`): a line longer than that is `line_too_long(name, ...)` after reading
    only that much, never the whole line."""
    limit = MAX_LINE_BYTES if limit is None else limit
    lineno = first_lineno
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise line_too_long(name, lineno, limit)
        yield raw
        lineno += 1


def decode_line(raw: bytes, name: str, lineno: int) -> str:
    """`raw` as strict UTF-8, or the one line naming file, line and byte (the column counts from 1)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SeqtrainError(
            f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line)"
        ) from None


def text_lines(f: IO[bytes], name: str, first_lineno: int = 1) -> Iterator[str]:
    """The lines of the binary file `f` as text, without their "\\n": bounded (`bounded_lines`) and strict UTF-8
    (`decode_line`); lines are split on "\\n" only, so a stray "\\r" or U+2028 inside a line never shifts lines."""
    for lineno, raw in enumerate(bounded_lines(f, name, first_lineno), first_lineno):
        line = decode_line(raw, name, lineno)
        yield line[:-1] if line.endswith("\n") else line
