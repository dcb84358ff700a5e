"""One training run per --save-dir: the lock file SAVE_DIR/.seqtrain.lock.

The lock holds its owner as JSON (host, pid, the process's start time from /proc, start time, a random run id
and a heartbeat time refreshed every HEARTBEAT_S seconds). It is taken before anything in the save dir is read or
deleted, and released when the run ends (normally, by an error, or after SIGTERM / SIGINT).

Taking it: the owner record is written to a temporary file and hard-linked to the lock name; link(2) fails if the
name exists, atomically, also on NFS (the classic NFS-safe lock, unlike O_EXCL on old NFS clients). A lock that
exists belongs to a live run unless it is stale:
  - same host: its pid is not running, or runs a process started at another time (the pid was reused);
  - another host: its heartbeat is older than STALE_AFTER_S (a killed or preempted node). This compares clocks
    of two machines: they must agree to within a few minutes (NTP).
  - any host: the file is garbage (not a JSON record, a pid that is no process number, a time that is not a
    finite number or lies in the future beyond the clock slack STALE_AFTER_S): no run wrote it.
The lock must be a regular file: it is looked at with lstat before it is opened, and opened without blocking,
so a FIFO, folder, device or symbolic link at the name is refused with one line, never waited on or followed.
A stale lock is taken over by atomically replacing it with this run's record and reading it back after a short
pause: of several runs taking over at once, the last to replace wins and the others see its record and refuse.

Guaranteed: two runs started at any moments on one host, or on hosts sharing the save dir over NFS, never both
train into it. Not guaranteed: a run on a host whose heartbeat thread is stalled longer than STALE_AFTER_S (e.g.
a suspended VM) can be declared stale by another host.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import socket
import stat
import threading
import time
import uuid
from typing import Any

import torch.distributed as dist

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import file_kind

logger = logging.getLogger("seqtrain.savedir_lock")  # the name log lines have always shown

LOCK_NAME = ".seqtrain.lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
_TAKEOVER_PAUSE_S = 0.2
_MAX_RECORD_BYTES = 64 * 1024  # a record is about 200 bytes; more than this is not one
_PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid on any host is larger


def _proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 (state) on; [] where /proc has no such pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return []
    # the command name (field 2) is parenthesised and may hold spaces: split after its closing parenthesis
    return stat[stat.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), None where /proc has no such pid."""
    fields = _proc_stat(pid)
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, 0) signals our own group and os.kill(-1, 0) every process: both "succeed"
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _proc_stat(pid)
    return not (fields and fields[0] in ("Z", "X"))  # a killed process its parent has not reaped yet is gone


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(owner: dict[str, Any]) -> str:
    """Who holds the lock, for the refusal."""
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner.get("started", 0))))
    except (TypeError, ValueError, OverflowError, OSError):
        since = "?"
    return f"host {owner.get('host', '?')}, pid {owner.get('pid', '?')}, since {since}"


class SaveDirLock:
    """The lock of one save dir, held by this process from `acquire()` until `release()`."""

    def __init__(self, save_dir: str):
        self.save_dir = save_dir
        self.path = os.path.join(save_dir, LOCK_NAME)
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "proc_start": process_start_time(os.getpid()),
            "started": time.time(),
            "heartbeat": time.time(),
            "run_id": uuid.uuid4().hex,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    # ------------------------------------------------------------------------------------------------ reading
    def read_owner(self) -> dict[str, Any] | None:
        """The lock's record; None when there is no lock; {} when it is not a record (garbage). Never blocks: the
        name is looked at (lstat) before it is opened, and opened with O_NONBLOCK | O_NOFOLLOW; anything but a
        regular file is a SeqtrainError (a FIFO there would hang an open, a link could point anywhere)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise self._not_a_file(st.st_mode)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:  # replaced by a symbolic link after the lstat
                raise self._not_a_file(stat.S_IFLNK) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # replaced by a FIFO or device after the lstat
                raise self._not_a_file(st.st_mode)
            raw = os.read(fd, _MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)
        if len(raw) > _MAX_RECORD_BYTES:
            return {}
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    def _not_a_file(self, mode: int) -> SeqtrainError:
        return SeqtrainError(
            f"--save-dir {self.save_dir}: the lock {self.path} is {file_kind(mode)}, not a regular file as seqtrain "
            "writes it; remove it (no training run made it) or use another --save-dir"
        )

    def garbage_reason(self, owner: dict[str, Any]) -> str | None:
        """Why `owner` cannot be a record written by a run (None when it can): no JSON object, or a field no run
        writes (a pid that is not a positive process number, a time that is not a finite number, a heartbeat
        or start later than now plus the clock slack between hosts)."""
        if not owner:
            return "not a JSON record of a run"
        pid = owner.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= _PID_MAX:
            return f"pid {_short(pid)} is not a process number"
        if not isinstance(owner.get("host"), str):
            return f"host {_short(owner.get('host'))} is not a host name"
        proc_start = owner.get("proc_start")
        if proc_start is not None and not (isinstance(proc_start, str) and proc_start.isdigit()):
            return f"proc_start {_short(proc_start)} is not a process start time"
        latest = time.time() + STALE_AFTER_S
        for key in ("started", "heartbeat"):
            value = owner.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"{key} {_short(value)} is not a time"
            if value < 0:
                return f"{key} {_short(value)} is before 1970"
            if value > latest:
                return f"{key} {_short(value)} is in the future"
        return None

    def stale_reason(self, owner: dict[str, Any]) -> str | None:
        """Why `owner` no longer holds the save dir (None while it may still run)."""
        garbage = self.garbage_reason(owner)
        if garbage is not None:
            return f"garbage lock file: {garbage}"
        pid = owner["pid"]
        if owner["host"] == socket.gethostname():
            if not _pid_alive(pid):
                return f"pid {pid} is not running"
            start = process_start_time(pid)
            if owner.get("proc_start") is not None and start is not None and start != owner["proc_start"]:
                return f"pid {pid} now belongs to another process"
            return None
        age = time.time() - float(owner.get("heartbeat", 0) or 0)
        if age > STALE_AFTER_S:
            return f"no heartbeat from host {owner['host']} for {age / 60:.0f} minutes"
        return None

    # ------------------------------------------------------------------------------------------------ writing
    def _write_temp(self) -> str:
        self.record["heartbeat"] = time.time()
        tmp = os.path.join(self.save_dir, f"{LOCK_NAME}.{self.record['run_id']}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.record, f)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def _owned(self) -> bool:
        try:
            owner = self.read_owner()
        except SeqtrainError:  # replaced by something that is not a lock file: not ours any more
            return False
        return bool(owner) and owner.get("run_id") == self.record["run_id"]

    def acquire(self) -> None:
        """Take the lock or raise SeqtrainError naming its owner."""
        try:
            os.makedirs(self.save_dir, exist_ok=True)
            for _ in range(3):
                if self._try_take():
                    break
            else:
                raise self._in_use(self.read_owner() or {})
        except OSError as e:
            raise SeqtrainError(
                f"--save-dir {self.save_dir}: cannot write there ({e.strerror or e}); "
                "pass a writable --save-dir or --no-save"
            ) from None
        self.held = True
        self._thread = threading.Thread(target=self._heartbeat, name="savedir-lock", daemon=True)
        self._thread.start()

    def _in_use(self, owner: dict[str, Any]) -> SeqtrainError:
        return SeqtrainError(
            f"--save-dir {self.save_dir} is in use by another training run ({_describe(owner)}); "
            f"wait for it to end or use another --save-dir (if that run is gone, delete {self.path})"
        )

    def _try_take(self) -> bool:
        """One attempt: create the lock, or take over a stale one. False: try again (it changed meanwhile)."""
        tmp = self._write_temp()
        try:
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                pass
            owner = self.read_owner()
            if owner is None:
                return False  # released between our link and our read
            reason = self.stale_reason(owner)
            if reason is None:
                raise self._in_use(owner)
            logger.warning(f"taking over the stale lock of {self.save_dir} ({reason})")
            os.replace(tmp, self.path)
            time.sleep(_TAKEOVER_PAUSE_S)
            if not self._owned():  # another run took it over at the same time, and replaced it after us
                raise self._in_use(self.read_owner() or {})
            return True
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                if not self._owned():
                    logger.error(f"the lock of {self.save_dir} was taken by another run")
                    return
                os.replace(self._write_temp(), self.path)

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):
            if self._owned():
                os.remove(self.path)
        self.held = False


@contextlib.contextmanager
def save_dir_lock(save_dir: str, rank: int = 0, world_size: int = 1):
    """Hold the lock of `save_dir` for the block: rank 0 takes it, the other ranks wait for rank 0's outcome;
    if rank 0 refuses, every rank raises the same one-line error."""
    lock = SaveDirLock(save_dir)
    error: str | None = None
    if rank == 0:
        try:
            lock.acquire()
        except SeqtrainError as e:
            error = str(e)
    if world_size > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise SeqtrainError(error)
    try:
        yield lock
    finally:
        lock.release()
