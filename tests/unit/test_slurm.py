"""`srun seqtrain-train`: ranks, devices and the rendezvous from SLURM's variables (seqtrain.slurm), and a
simulated 2-task srun step on the CPU that ends with the same parameters as torchrun."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.slurm import PORT_BASE, expand_hostlist, first_host, iter_hostlist, slurm_task

BIN = os.path.dirname(sys.executable)
TORCHRUN = os.path.join(BIN, "torchrun")


@pytest.mark.parametrize(
    "text,hosts",
    [
        ("localhost", ["localhost"]),
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("r[1-2]n[09-10]", ["r1n09", "r1n10", "r2n09", "r2n10"]),
        ("x-[1,3],y", ["x-1", "x-3", "y"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_expand_hostlist_bad_range():
    with pytest.raises(SeqtrainError, match="cannot read the range 'a-3'"):
        expand_hostlist("n[a-3]")


def test_first_host_of_a_huge_range_is_not_expanded(monkeypatch):
    """Before (issue 31): node[0-99999999] was expanded whole (10^8 names, gigabytes) to take its first one."""
    monkeypatch.setattr("shutil.which", lambda name: None)
    hosts = iter_hostlist("gpu[7-99999999999999999999],node[0-99999999]")
    assert (next(hosts), next(hosts)) == ("gpu7", "gpu8")
    assert first_host("node[0-99999999]x[00-99999999]") == "node0x00"
    with pytest.raises(SeqtrainError, match="cannot read the range 'b'"):  # every range is read first
        first_host("node[0-99999999],x[b]")


def test_first_host_reads_one_line_of_scontrol(tmp_path, monkeypatch):
    """scontrol's output is read up to its first line and scontrol ended: before, the whole list was captured
    (here an scontrol that never stops printing: a 60 s timeout, then our own full expansion)."""
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\ni=0\nwhile :; do echo "host$i"; i=$((i+1)); done\n')
    fake.chmod(0o755)
    monkeypatch.setattr("shutil.which", lambda name: str(fake))
    start = time.monotonic()
    assert first_host("node[0-99999999]") == "host0"
    assert time.monotonic() - start < 10


def _slurm_env(monkeypatch, **values):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    monkeypatch.setattr("shutil.which", lambda name: None)  # no scontrol: our own parser
    for k, v in values.items():
        monkeypatch.setenv(k, str(v))


def test_one_task_per_gpu(monkeypatch):
    _slurm_env(
        monkeypatch,
        SLURM_STEP_ID=0,
        SLURM_JOB_ID=123456,
        SLURM_PROCID=11,
        SLURM_LOCALID=3,
        SLURM_NTASKS=16,
        SLURM_NNODES=2,
        SLURM_NTASKS_PER_NODE="8(x2)",
        SLURM_JOB_NODELIST="gpu[007-008]",
    )
    task = slurm_task(-1, 1, 8)
    assert (task.world_size, task.rank, task.local_rank, task.procs_per_task) == (16, 11, 3, 1)
    assert task.init_method == f"tcp://gpu007:{PORT_BASE + 123456 % 20000}"
    assert slurm_task(29500, 1, 8).init_method == "tcp://gpu007:29500"  # --distributed-port wins


def test_one_task_per_node_spawns(monkeypatch):
    _slurm_env(
        monkeypatch,
        SLURM_STEP_ID=0,
        SLURM_JOB_ID=7,
        SLURM_PROCID=1,
        SLURM_NODEID=1,
        SLURM_NTASKS=2,
        SLURM_NNODES=2,
        SLURM_NTASKS_PER_NODE=1,
        SLURM_STEP_NODELIST="n[3,5]",
    )
    task = slurm_task(-1, 1, 4)  # 4 GPUs per node
    assert (task.world_size, task.rank, task.procs_per_task, task.init_method) == (8, 4, 4, "tcp://n3:15007")
    cpu = slurm_task(-1, 6, 0)  # CPU: --distributed-world-size 6 over 2 nodes
    assert (cpu.world_size, cpu.rank, cpu.procs_per_task) == (6, 3, 3)


def test_not_an_srun_step(monkeypatch):
    _slurm_env(monkeypatch, SLURM_JOB_ID=5, SLURM_PROCID=0, SLURM_NTASKS=4)  # the batch script itself
    assert slurm_task(-1, 1, 0) is None
    _slurm_env(
        monkeypatch, SLURM_STEP_ID=0, SLURM_PROCID=0, SLURM_NTASKS=1, SLURM_NODELIST="h", SLURM_NNODES=1
    )
    assert slurm_task(-1, 1, 0) is None  # a single task, single process: a plain run


_STEP = dict(
    SLURM_STEP_ID=0, SLURM_JOB_ID=9, SLURM_PROCID=0, SLURM_NTASKS=2, SLURM_NNODES=1, SLURM_NODELIST="n1"
)


@pytest.mark.parametrize(
    "change,line",
    [
        # tracebacks before (ValueError in int(), or a node list handed on to the rendezvous as it was)
        (
            {"SLURM_NODELIST": "node[01-"},
            "SLURM_NODELIST='node[01-': '[' without its ']'; not a SLURM node list",
        ),
        ({"SLURM_NODELIST": "n]1["}, "SLURM_NODELIST='n]1[': ']' without its '['; not a SLURM node list"),
        (
            {"SLURM_NODELIST": "n[[1]]"},
            "SLURM_NODELIST='n[[1]]': '[' inside a bracket group; not a SLURM node list",
        ),
        ({"SLURM_NODELIST": "n[3-1]"}, "SLURM_NODELIST='n[3-1]': the range '3-1' runs backwards"),
        ({"SLURM_NODELIST": "n[1-x]"}, "SLURM_NODELIST='n[1-x]': cannot read the range '1-x'"),
        ({"SLURM_NODELIST": ",,"}, "SLURM_NODELIST=',,' names no host"),
        ({"SLURM_NTASKS": "1e20"}, "SLURM_NTASKS='1e20' is not an integer"),
        # accepted before: a world of 10^20 ranks, 0 nodes, or a rank that waits 30 minutes for peers
        (
            {"SLURM_NTASKS": "100000000000000000000"},
            "SLURM_NTASKS='100000000000000000000' is out of range: must be between 1 and 1048576",
        ),
        ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS='0' is out of range: must be between 1 and 1048576"),
        ({"SLURM_NTASKS": "-2"}, "SLURM_NTASKS='-2' is out of range: must be between 1 and 1048576"),
        ({"SLURM_NNODES": "0"}, "SLURM_NNODES='0' is out of range: must be between 1 and 1048576"),
        ({"SLURM_NNODES": "3"}, "SLURM_NNODES=3 is more nodes than SLURM_NTASKS=2 tasks"),
        (
            {"SLURM_PROCID": "-1"},
            "SLURM_PROCID='-1' is out of range: must be between 0 and 1 (SLURM_NTASKS=2)",
        ),
        ({"SLURM_PROCID": "5"}, "SLURM_PROCID='5' is out of range: must be between 0 and 1 (SLURM_NTASKS=2)"),
        (
            {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "4"},
            "SLURM_PROCID='4' is out of range: must be between 0 and 3 (SLURM_STEP_NUM_TASKS=4)",
        ),
        (
            {"SLURM_NTASKS_PER_NODE": "0"},
            "SLURM_NTASKS_PER_NODE='0' is out of range: must be between 1 and 2 (SLURM_NTASKS=2)",
        ),
        (
            {"SLURM_LOCALID": "-1"},
            "SLURM_LOCALID='-1' is out of range: must be between 0 and 1 (SLURM_NTASKS=2)",
        ),
        ({"SLURM_JOB_ID": "x"}, "SLURM_JOB_ID='x' is not an integer"),
        (
            {"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODEID": "2"},
            "SLURM_NODEID='2' is out of range: must be between 0 and 1 (SLURM_NNODES=2)",
        ),
    ],
)
def test_garbage_slurm_values_give_one_line_naming_the_variable(monkeypatch, change, line):
    _slurm_env(monkeypatch, **{**_STEP, **change})
    with pytest.raises(SeqtrainError) as e:
        slurm_task(-1, 1, 0)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_valid_steps_still_accepted(monkeypatch):
    _slurm_env(monkeypatch, **{**_STEP, "SLURM_PROCID": 1, "SLURM_NODELIST": "n[1-2],m[08-09,11]"})
    task = slurm_task(-1, 1, 0)
    assert (task.world_size, task.rank, task.init_method) == (2, 1, "tcp://n1:15009")


# ------------------------------------------------------------------------------------------------ end to end
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(data, save):
    return [
        data, "--arch", "bart_tiny", "--cpu", "--dropout", "0", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "3", "--batch-size", "16", "--seed", "5", "--max-update", "6", "--update-freq", "2",
        "--no-epoch-checkpoints", "--log-format", "simple", "--save-dir", save,
    ]  # fmt: skip


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")]))
    env.update(extra or {})
    return env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_simulated_srun_step_equals_torchrun(toy_databin, tmp_path):
    if not os.path.exists(TORCHRUN):
        pytest.skip("torchrun not installed next to this python")
    data = toy_databin(n_train=100, n_valid=40)
    cmd = [sys.executable, "-m", "seqtrain_cli.train"]
    torchrun_save, slurm_save = str(tmp_path / "torchrun"), str(tmp_path / "slurm")
    ref = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "seqtrain_cli.train",
            *_args(data, torchrun_save),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    # what `srun --ntasks 2 --ntasks-per-node 2 seqtrain-train ...` sets, with no scontrol on the PATH
    common = dict(
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID="0",
        SLURM_NTASKS="2",
        SLURM_NNODES="1",
        SLURM_NTASKS_PER_NODE="2",
        SLURM_NODELIST="127.0.0.1",
        SLURM_JOB_NODELIST="127.0.0.1",
        PATH=os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin",
    )
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [*cmd, *_args(data, slurm_save), "--distributed-port", port],
            env=_env({**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NODEID": "0"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "training on 2 devices (cpu, pytorch_ddp)" in outs[0][0]  # rank 0 logs; the two tasks made one job
    a = load_checkpoint_file(os.path.join(torchrun_save, "checkpoint_last.pt"))
    b = load_checkpoint_file(os.path.join(slurm_save, "checkpoint_last.pt"))
    assert a["extra_state"]["num_updates"] == b["extra_state"]["num_updates"] == 6
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
