"""seqtrain.host_cpu: the bf16 warning and the thread choice, with the machine's answers patched in, so
each test gives the same result on any CPU (with or without AVX-512-BF16 / AMX, idle or loaded)."""

from __future__ import annotations

import re

import pytest
import torch

from seqtrain import host_cpu


@pytest.mark.parametrize(
    ("machine", "flags", "torch_bf16", "want"),
    [
        ("x86_64", None, (False, False), False),  # AVX2 EPYC: torch's probe says no
        ("x86_64", None, (True, False), True),  # AVX-512-BF16
        ("x86_64", None, (False, True), True),  # AMX
        ("aarch64", "fp asimd bf16 sve", None, True),
        ("aarch64", "fp asimd", None, False),
        ("aarch64", "", None, None),  # no /proc/cpuinfo: cannot tell
        ("riscv64", None, None, None),
    ],
)
def test_cpu_has_bf16(monkeypatch, machine, flags, torch_bf16, want):
    monkeypatch.setattr(host_cpu.platform, "machine", lambda: machine)
    monkeypatch.setattr(host_cpu, "cpu_flags", lambda path="": set((flags or "").split()))
    if torch_bf16 is not None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: torch_bf16[0])
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: torch_bf16[1])
    assert host_cpu.cpu_has_bf16() is want


def test_cpu_flags_reads_the_kernels_list(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\nprocessor\t: 1\n")
    assert host_cpu.cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert host_cpu.cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.parametrize("has_bf16", [False, True, None])
def test_bf16_warning_only_on_a_cpu_that_emulates_it(monkeypatch, has_bf16):
    monkeypatch.setattr(host_cpu, "cpu_has_bf16", lambda: has_bf16)
    monkeypatch.setattr(host_cpu, "cpu_capability", lambda: "AVX2")
    line = host_cpu.bf16_cpu_warning(True, "cpu")
    if has_bf16 is False:
        assert line.startswith("--bf16 on a CPU without bf16 instructions") and "\n" not in line
        assert "about 6x slower than fp32" in line and "torch sees AVX2" in line and "drop --bf16" in line
    else:
        assert line is None
    assert host_cpu.bf16_cpu_warning(False, "cpu") is None  # fp32 runs: nothing to say
    assert host_cpu.bf16_cpu_warning(True, "cuda") is None  # the GPU's bf16 is native


@pytest.mark.parametrize(
    ("usable", "load", "ranks", "want"),
    [
        (2, 0.1, 1, 2),  # idle 2-core machine: torch's default
        (2, 1.0, 1, 1),  # one other job: one thread, not two fighting for a core
        (2, 6.5, 1, 1),  # oversubscribed: never fewer than one
        (16, 3.2, 1, 13),
        (16, 0.0, 4, 4),  # 4 ranks share the machine
        (16, 8.0, 4, 2),
        (8, None, 1, 8),  # no load average (not Linux): every usable CPU
    ],
)
def test_choose_threads(usable, load, ranks, want):
    assert host_cpu.choose_threads(usable, load, ranks) == want


def test_cgroup_quota_caps_the_cpus(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert host_cpu.cgroup_cpu_limit(str(tmp_path)) == 1.5
    monkeypatch.setattr(host_cpu, "CGROUP", str(tmp_path))
    monkeypatch.setattr(host_cpu.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert host_cpu.usable_cpus() == 2  # 1.5 CPUs of quota: two threads can use it
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert host_cpu.usable_cpus() == 4
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert host_cpu.cgroup_cpu_limit(str(v1)) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert host_cpu.cgroup_cpu_limit(str(v1)) == 3.0


def test_fit_threads_sets_torch_and_says_so(monkeypatch):
    n = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(host_cpu, "usable_cpus", lambda: 2)
        monkeypatch.setattr(host_cpu, "load_average", lambda: 5.3)
        torch.set_num_threads(2)
        line = host_cpu.fit_threads("cpu")
        assert torch.get_num_threads() == 1
        assert line == (
            "the machine is busy (2 usable CPUs, load 5.3): training uses 1 intra-op thread instead of "
            "torch's 2; set OMP_NUM_THREADS to choose yourself"
        )
        monkeypatch.setattr(host_cpu, "load_average", lambda: 0.2)
        assert (
            host_cpu.fit_threads("cpu")
            == "intra-op threads: 2 (2 usable CPUs, load 0.2; OMP_NUM_THREADS overrides)"
        )
        assert torch.get_num_threads() == 2
        # an explicit OMP_NUM_THREADS, or a GPU run: torch's setting is left alone, nothing is logged
        torch.set_num_threads(1)
        assert host_cpu.fit_threads("cuda") is None
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setattr(host_cpu, "load_average", lambda: 0.0)
        assert host_cpu.fit_threads("cpu") is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", " "])
def test_an_omp_num_threads_that_sets_no_threads_is_said_and_seqtrain_chooses(monkeypatch, value):
    """Issue 48, class 10: OpenMP ignores OMP_NUM_THREADS=0/-1/abc (libgomp: "Invalid value") and torch starts
    its default; seqtrain chose nothing then (the variable was set) and said nothing. Now it chooses as if it
    were unset and says why in one line; a positive whole number still wins."""
    n = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        monkeypatch.setattr(host_cpu, "usable_cpus", lambda: 2)
        monkeypatch.setattr(host_cpu, "load_average", lambda: 1.0)
        torch.set_num_threads(2)
        line = host_cpu.fit_threads("cpu")
        assert torch.get_num_threads() == 1
        if value.strip():
            assert line == (
                f"OMP_NUM_THREADS={value!r} is no positive number of threads (OpenMP ignores it): training uses 1 "
                "intra-op thread (2 usable CPUs, load 1.0); set it to 1 or more to choose yourself"
            )
        else:  # set but blank: as unset
            assert line.startswith("the machine is busy (2 usable CPUs, load 1.0): training uses 1 intra-op")
        monkeypatch.setenv("OMP_NUM_THREADS", " 2")
        assert host_cpu.omp_threads() == (2, " 2") and host_cpu.fit_threads("cpu") is None
    finally:
        torch.set_num_threads(n)


def test_the_module_prints_the_choice_for_scripts():
    """scripts/quickstart.sh exports `python -m seqtrain.host_cpu`'s number as OMP_NUM_THREADS."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "seqtrain.host_cpu"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert 1 <= int(out.stdout) <= len(os.sched_getaffinity(0))
    assert re.fullmatch(r"\d+ usable CPUs?, load ([\d.]+|unknown)\n", out.stderr)


def _stat(tmp_path, name, busy, idle, cpus=2):
    """A /proc/stat with `busy` user jiffies and `idle` idle jiffies in its aggregate line."""
    path = tmp_path / name
    per_cpu = "".join(f"cpu{i} 0 0 0 0 0 0 0 0 0 0\n" for i in range(cpus))
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n{per_cpu}intr 1\n")
    return str(path)


def test_cpu_times_reads_the_aggregate_line(tmp_path):
    path = tmp_path / "stat"
    path.write_text("cpu  100 5 20 800 40 3 2 30 7 0\ncpu0 1 0 0 0 0 0 0 0 0 0\ncpu1 1 0 0 0 0 0 0 0 0 0\n")
    # busy: user + nice + system + irq + softirq + steal (not idle, not iowait); guest is inside user already
    assert host_cpu.cpu_times(str(path)) == (160, 1000, 2)
    assert host_cpu.cpu_times(str(tmp_path / "missing")) is None


def test_busy_cpus_now_counts_the_jiffies_between_two_samples(tmp_path, monkeypatch):
    samples = iter([_stat(tmp_path, "a", 1000, 1000), _stat(tmp_path, "b", 1150, 1050)])
    real = host_cpu.cpu_times
    monkeypatch.setattr(host_cpu, "cpu_times", lambda path: real(next(samples)))
    monkeypatch.setattr(host_cpu.time, "sleep", lambda s: None)
    # 150 busy of 200 jiffies on 2 CPUs: 1.5 CPUs busy
    assert host_cpu.busy_cpus_now() == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("average", "now", "want"),
    [
        (
            0.9,
            0.05,
            0.05,
        ),  # the run's own preprocessing still in the 1-minute average: the machine is idle now
        (0.1, 1.9, 0.1),  # a burst now on a machine idle for the last minute
        (2.0, 2.0, 2.0),  # busy by both
        (1.2, None, 1.2),  # no /proc/stat
    ],
)
def test_load_is_the_lower_of_the_average_and_now(monkeypatch, average, now, want):
    monkeypatch.setattr(host_cpu.os, "getloadavg", lambda: (average, 0.0, 0.0))
    monkeypatch.setattr(host_cpu, "busy_cpus_now", lambda: now)
    assert host_cpu.load_average() == pytest.approx(want)
    # and what a 2-core machine trains with then
    assert host_cpu.choose_threads(2, host_cpu.load_average()) == (2 if want < 0.5 else 1)
