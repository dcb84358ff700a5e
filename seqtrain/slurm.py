"""`srun seqtrain-train ...`: the job's ranks from SLURM's environment, as fairseq's infer_init_method does.

A process started by srun (SLURM_STEP_ID and SLURM_PROCID set) is one task of the step:
  - one task per GPU (SLURM_NTASKS_PER_NODE > 1, e.g. `--ntasks-per-node 8 --gpus-per-node 8`): this task is
    rank SLURM_PROCID of SLURM_NTASKS (SLURM_STEP_NUM_TASKS) and uses local device SLURM_LOCALID;
  - one task per node (SLURM_NTASKS_PER_NODE == 1) with several devices: the task spawns one process per GPU of
    its node (--distributed-world-size / nodes on the CPU), ranks SLURM_NODEID * per_node + i.
The rendezvous is tcp://FIRST_HOST:PORT: FIRST_HOST is the first host of SLURM_STEP_NODELIST (or
SLURM_JOB_NODELIST, SLURM_NODELIST), expanded by `scontrol show hostnames` where scontrol exists and by
`expand_hostlist` otherwise; PORT is --distributed-port, or else derived from SLURM_JOB_ID, so every task
computes the same one.
torchrun's variables (RANK, WORLD_SIZE, ...), when present, win (`srun torchrun ...` works too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from seqtrain.errors import SeqtrainError

PORT_BASE, PORT_RANGE = 15000, 20000
_BRACKET = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5; several bracket
    groups in one name expand to every combination ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2)."""
    hosts: list[str] = []
    for name in _split_top_level(text.strip()):
        m = _BRACKET.search(name)
        if m is None:
            if name:
                hosts.append(name)
            continue
        head, tail = name[: m.start()], name[m.end() :]
        for item in m.group(1).split(","):
            lo, sep, hi = item.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                raise SeqtrainError(f"SLURM node list {text!r}: cannot read the range {item!r}")
            values = range(int(lo), int(hi) + 1) if sep else [int(lo)]
            for v in values:
                hosts += expand_hostlist(f"{head}{v:0{len(lo)}d}{tail}")
    return hosts


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
    """The first host of a SLURM node list: scontrol's expansion where it is installed, else ours."""
    scontrol = shutil.which("scontrol")
    if scontrol is not None:
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", node_list],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = expand_hostlist(node_list)
    if not hosts:
        raise SeqtrainError(f"SLURM node list {node_list!r} names no host")
    return hosts[0]


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
