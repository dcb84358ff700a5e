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


def _int_env(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise SeqtrainError(
                f"srun set SLURM_PROCID but not {name}; launch with srun inside an allocation"
            )
        return default
    try:
        return int(value.split("(")[0].split(",")[0])  # "2(x3)" forms: the first node's count
    except ValueError:
        raise SeqtrainError(f"{name}={value!r} is not an integer") from None


def slurm_task(distributed_port: int, world_size_flag: int, cuda_devices: int) -> SlurmTask | None:
    """This process's SlurmTask when srun started it, else None. `world_size_flag`: --distributed-world-size
    (used for the processes per node of a one-task-per-node CPU job); `cuda_devices`: GPUs on this node."""
    if "SLURM_STEP_ID" not in os.environ or "SLURM_PROCID" not in os.environ:
        return None
    ntasks = _int_env("SLURM_STEP_NUM_TASKS", _int_env("SLURM_NTASKS", 1))
    nnodes = _int_env("SLURM_STEP_NUM_NODES", _int_env("SLURM_NNODES", 1))
    if "SLURM_NTASKS_PER_NODE" in os.environ:
        per_node = _int_env("SLURM_NTASKS_PER_NODE")
    else:
        per_node = max(1, ntasks // max(1, nnodes))
    procs = 1
    if per_node == 1:
        procs = cuda_devices if cuda_devices > 0 else max(1, world_size_flag // nnodes)
    if ntasks * procs <= 1:
        return None  # one process in all: nothing distributed
    node_list = next(
        (
            os.environ[k]
            for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            if os.environ.get(k)
        ),
        None,
    )
    if not node_list:
        raise SeqtrainError("srun set SLURM_PROCID but no SLURM_STEP_NODELIST / SLURM_JOB_NODELIST")
    port = distributed_port if distributed_port > 0 else PORT_BASE + _int_env("SLURM_JOB_ID", 0) % PORT_RANGE
    init_method = f"tcp://{first_host(node_list)}:{port}"
    if per_node == 1:
        node_id = _int_env("SLURM_NODEID", _int_env("SLURM_PROCID"))
        return SlurmTask(nnodes * procs, node_id * procs, 0, procs, init_method)
    return SlurmTask(ntasks, _int_env("SLURM_PROCID"), _int_env("SLURM_LOCALID", 0), 1, init_method)
