"""`srun seqtrain-train ...`: the job's ranks from SLURM's environment, as fairseq's infer_init_method does.

A process started by srun (SLURM_STEP_ID and SLURM_PROCID set) is one task of the step:
  - one task per GPU (SLURM_NTASKS_PER_NODE > 1, e.g. `--ntasks-per-node 8 --gpus-per-node 8`): this task is
    rank SLURM_PROCID of SLURM_NTASKS (SLURM_STEP_NUM_TASKS) and uses local device SLURM_LOCALID;
  - one task per node (SLURM_NTASKS_PER_NODE == 1) with several devices: the task spawns one process per GPU of
    its node (--distributed-world-size / nodes on the CPU), ranks SLURM_NODEID * per_node + i.
The rendezvous is tcp://FIRST_HOST:PORT: FIRST_HOST is the first host of SLURM_STEP_NODELIST (or
SLURM_JOB_NODELIST, SLURM_NODELIST), from `scontrol show hostnames` where scontrol exists and from
`iter_hostlist` otherwise, only the first host made either way (`node[0-99999999]` is never expanded whole);
PORT is --distributed-port, or else derived from SLURM_JOB_ID, so every task computes the same one.
torchrun's variables (RANK, WORLD_SIZE, ...), when present, win (`srun torchrun ...` works too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from seqtrain.errors import SeqtrainError

PORT_BASE, PORT_RANGE = 15000, 20000
_BRACKET = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5; several bracket
    groups in one name expand to every combination ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2)."""
    return list(iter_hostlist(text))


def iter_hostlist(text: str) -> Iterator[str]:
    """The hosts of a compressed host list one by one, as expand_hostlist lists them, without expanding the
    rest: the first host of "node[0-99999999]" costs one name, not 10^8. Every range of the list is read (and
    a bad one refused) before the first host is given."""
    names = [name for name in _split_top_level(text.strip()) if name]
    for name in names:
        for item in _BRACKET.findall(name):
            for part in item.split(","):
                _range(text, part)
    for name in names:
        yield from _iter_name(text, name)


def _range(text: str, item: str) -> tuple[range, int]:
    """The numbers of one bracket item ("07", "01-03") and their zero-padded width."""
    lo, sep, hi = item.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise SeqtrainError(f"SLURM node list {text!r}: cannot read the range {item!r}")
    return (range(int(lo), int(hi) + 1) if sep else range(int(lo), int(lo) + 1)), len(lo)


def _iter_name(text: str, name: str) -> Iterator[str]:
    m = _BRACKET.search(name)
    if m is None:
        yield name
        return
    head, tail = name[: m.start()], name[m.end() :]
    for item in m.group(1).split(","):
        values, width = _range(text, item)
        for v in values:  # a range object: numbers are made as they are taken
            yield from _iter_name(text, f"{head}{v:0{width}d}{tail}")


def _split_top_level(text: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def first_host(node_list: str) -> str:
    """The first host of a SLURM node list: scontrol's expansion where it is installed, else ours; either way
    only the first name is made (scontrol's output is read up to its first line, then scontrol is ended)."""
    scontrol = shutil.which("scontrol")
    if scontrol is not None:
        host = _scontrol_first_host(scontrol, node_list)
        if host:
            return host
    host = next(iter_hostlist(node_list), None)
    if host is None:
        raise SeqtrainError(f"SLURM node list {node_list!r} names no host")
    return host


def _scontrol_first_host(scontrol: str, node_list: str, timeout: float = 60) -> str | None:
    """The first line `scontrol show hostnames LIST` prints (None if it fails or prints nothing in `timeout`
    seconds); scontrol is killed after it, so a list of 10^8 hosts is never printed whole."""
    try:
        proc = subprocess.Popen(
            [scontrol, "show", "hostnames", node_list],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline().strip() if proc.stdout is not None else ""
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return line.split()[0] if line else None


@dataclass
class SlurmTask:
    """This process's place in an srun step."""

    world_size: int  # ranks in the job
    rank: int  # this task's rank (one task per GPU) or its node's first rank (one task per node)
    local_rank: int
    procs_per_task: int  # 1, or the processes this task spawns (one task per node)
    init_method: str


_COUNT_MAX = 1 << 20  # tasks or nodes in one step: SLURM's own limits are far below this
_INT = re.compile(r"[+-]?[0-9]+")
_RANGE = re.compile(r"[0-9]+(-[0-9]+)?")


def _int_env(
    name: str, default: int | None = None, low: int = 0, high: int = 2**63 - 1, what: str = ""
) -> int:
    """The integer in SLURM variable `name` (the first node's count of "2(x3)" forms), within [low, high];
    `default` where it is unset. Every other value is one line naming the variable: a value srun never sets
    (1e20, -1, 0 tasks) would otherwise give a traceback or a rank that waits 30 minutes for peers."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise SeqtrainError(
                f"srun set SLURM_PROCID but not {name}; launch with srun inside an allocation"
            )
        return default
    text = value.split("(")[0].split(",")[0].strip()
    if not _INT.fullmatch(text):
        raise SeqtrainError(f"{name}={value!r} is not an integer")
    number = int(text) if len(text) <= 20 else (-1 if text.startswith("-") else 1) * 2**64  # past any bound
    if not low <= number <= high:
        raise SeqtrainError(
            f"{name}={value!r} is out of range: must be between {low} and {high}{what}; "
            "launch with srun inside an allocation"
        )
    return number


def _count_env(names: tuple[str, ...], default: int) -> tuple[str, int]:
    """The first of `names` that is set, as (name, count of 1 or more); (names[-1], default) when none is."""
    for name in names:
        if name in os.environ:
            return name, _int_env(name, low=1, high=_COUNT_MAX)
    return names[-1], default


def check_node_list(name: str, value: str) -> None:
    """SLURM's compressed host list syntax, checked before anything expands or resolves it: names separated by
    commas, each with bracket groups of numbers and ascending ranges ("node[01-03,07]"), nothing unbalanced."""
    depth, group = 0, ""
    for ch in value:
        if ch == "[":
            if depth:
                raise SeqtrainError(f"{name}={value!r}: '[' inside a bracket group; not a SLURM node list")
            depth, group = 1, ""
        elif ch == "]":
            if not depth:
                raise SeqtrainError(f"{name}={value!r}: ']' without its '['; not a SLURM node list")
            for item in group.split(","):
                if not _RANGE.fullmatch(item):
                    raise SeqtrainError(f"{name}={value!r}: cannot read the range {item!r}")
                lo, _, hi = item.partition("-")
                if hi and int(hi) < int(lo):
                    raise SeqtrainError(f"{name}={value!r}: the range {item!r} runs backwards")
            depth = 0
        elif depth:
            group += ch
        elif ch.isspace() or not ch.isprintable():
            raise SeqtrainError(f"{name}={value!r}: a host name holds no spaces or control characters")
    if depth:
        raise SeqtrainError(f"{name}={value!r}: '[' without its ']'; not a SLURM node list")
    if not any(part.strip() for part in _split_top_level(value)):
        raise SeqtrainError(f"{name}={value!r} names no host")


def slurm_task(distributed_port: int, world_size_flag: int, cuda_devices: int) -> SlurmTask | None:
    """This process's SlurmTask when srun started it, else None. `world_size_flag`: --distributed-world-size
    (used for the processes per node of a one-task-per-node CPU job); `cuda_devices`: GPUs on this node."""
    if "SLURM_STEP_ID" not in os.environ or "SLURM_PROCID" not in os.environ:
        return None
    tasks_name, ntasks = _count_env(("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1)
    nodes_name, nnodes = _count_env(("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 1)
    if nnodes > ntasks:
        raise SeqtrainError(
            f"{nodes_name}={nnodes} is more nodes than {tasks_name}={ntasks} tasks; launch with srun inside an "
            "allocation"
        )
    if "SLURM_NTASKS_PER_NODE" in os.environ:
        per_node = _int_env("SLURM_NTASKS_PER_NODE", low=1, high=ntasks, what=f" ({tasks_name}={ntasks})")
    else:
        per_node = max(1, ntasks // max(1, nnodes))
    procid = _int_env("SLURM_PROCID", low=0, high=ntasks - 1, what=f" ({tasks_name}={ntasks})")
    procs = 1
    if per_node == 1:
        procs = cuda_devices if cuda_devices > 0 else max(1, world_size_flag // nnodes)
    if ntasks * procs <= 1:
        return None  # one process in all: nothing distributed
    node_var, node_list = next(
        (
            (k, os.environ[k])
            for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            if os.environ.get(k)
        ),
        ("", None),
    )
    if not node_list:
        raise SeqtrainError("srun set SLURM_PROCID but no SLURM_STEP_NODELIST / SLURM_JOB_NODELIST")
    check_node_list(node_var, node_list)
    job_id = _int_env("SLURM_JOB_ID", 0)
    port = distributed_port if distributed_port > 0 else PORT_BASE + job_id % PORT_RANGE
    init_method = f"tcp://{first_host(node_list)}:{port}"
    if per_node == 1:
        node_id = _int_env("SLURM_NODEID", procid, high=nnodes - 1, what=f" ({nodes_name}={nnodes})")
        return SlurmTask(nnodes * procs, node_id * procs, 0, procs, init_method)
    local_id = _int_env("SLURM_LOCALID", 0, high=ntasks - 1, what=f" ({tasks_name}={ntasks})")
    return SlurmTask(ntasks, procid, local_id, 1, init_method)
