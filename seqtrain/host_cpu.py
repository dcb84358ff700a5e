"""What the CPU a run trains on can do, and how many threads it should use: two start-up decisions that made a
busy or older machine many times slower without a word (issue 41).

- bf16 on a CPU: autocast's bf16 matrix products are fast only with native bf16 instructions (x86 AVX-512-BF16
  or AMX, Arm's BF16 extension); without them oneDNN and ATen convert every operand to fp32 and back, and a run
  that asked for `--bf16` to go faster goes about 6x slower (measured figures in docs/training.md). seqtrain
  keeps the flag's meaning (the numbers a bf16 run gives are its own, and fairseq's parity tests use them) and
  says so in one warning line with the cost, instead of switching precision behind the user's back.
- Intra-op threads: torch starts one thread per core it sees, whatever else runs there. On a 2-core machine with
  other work, two spin-waiting threads per matrix product made updates 3-5x slower than one thread. seqtrain
  picks the threads from the CPUs it may use (affinity mask, cgroup CPU quota) minus the load other work puts
  on them (the lower of the 1-minute load average and the CPUs busy right now), once at start-up, and logs
  what it chose. OMP_NUM_THREADS, when set to a positive whole number, always wins (torchrun sets it to 1 for
  its workers); set to anything else (0, -1, abc: OpenMP ignores it) seqtrain chooses and says why.

The probes are plain functions so tests can patch them and get the same answer on any machine.
"""

from __future__ import annotations

import math
import os
import platform
import time

import torch

BF16_CPU_SLOWDOWN = "about 6x"  # bart_tiny, 2-core AVX2 EPYC: 1,737-1,840 words/s fp32, 282-283 with --bf16
CGROUP = "/sys/fs/cgroup"


# ------------------------------------------------------------------------------------------------ bf16
def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags as the kernel lists them (x86 `flags`, Arm `Features`); empty when unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def cpu_has_bf16() -> bool | None:
    """Native bf16 matrix instructions: True, False, or None when this machine cannot tell (not Linux, an
    architecture seqtrain does not know). x86 asks torch's own cpuinfo probe (what its kernels dispatch on), Arm
    reads the kernel's flags."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        probe = getattr(torch, "cpu", None)
        if probe is not None and hasattr(probe, "_is_avx512_bf16_supported"):
            return bool(probe._is_avx512_bf16_supported() or probe._is_amx_tile_supported())
        flags = cpu_flags()
        return bool(flags & {"avx512_bf16", "amx_bf16"}) if flags else None
    if machine in ("aarch64", "arm64"):
        flags = cpu_flags()
        return "bf16" in flags if flags else None
    return None


def bf16_cpu_warning(bf16: bool, device_type: str) -> str | None:
    """The one warning line for `--bf16` on a CPU without bf16 instructions, else None."""
    if not bf16 or device_type != "cpu" or cpu_has_bf16() is not False:
        return None
    return (
        f"--bf16 on a CPU without bf16 instructions (no AVX-512-BF16 or AMX; torch sees {cpu_capability()}): "
        f"each bf16 matrix product is emulated in fp32, {BF16_CPU_SLOWDOWN} slower than fp32 training here; "
        "drop --bf16 to train faster (same model, fp32 numbers)"
    )


def cpu_capability() -> str:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # an old or unusual build: only the warning's wording depends on it
        return "unknown"


# ------------------------------------------------------------------------------------------------ threads
def cgroup_cpu_limit(root: str | None = None) -> float | None:
    """The CPUs a cgroup quota allows (cgroup v2 cpu.max "QUOTA PERIOD", v1 cfs_quota_us / cfs_period_us), or
    None without a limit."""
    root = root or CGROUP
    try:
        with open(os.path.join(root, "cpu.max"), encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us"), encoding="ascii") as f:
            quota_us = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us"), encoding="ascii") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup quota (rounded up)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, n)


def cpu_times(path: str = "/proc/stat") -> tuple[int, int, int] | None:
    """(busy jiffies, all jiffies, CPUs) of the whole machine from /proc/stat's aggregate `cpu` line (busy: all
    but idle and iowait; steal counts as busy: the CPU was not ours), or None where it is unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
        fields = [int(x) for x in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    total = sum(fields)
    return total - fields[3] - fields[4], total, max(1, cpus)


def busy_cpus_now(interval: float = 0.25, path: str = "/proc/stat") -> float | None:
    """How many CPUs other work keeps busy right now: /proc/stat sampled `interval` seconds apart (this process
    sleeps meanwhile, so it counts only the others), or None where it cannot tell."""
    first = cpu_times(path)
    if first is None:
        return None
    time.sleep(interval)
    second = cpu_times(path)
    if second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * second[2]


def load_average() -> float | None:
    """The load other work puts on the machine: the lower of the 1-minute load average and the CPUs busy right
    now. The average alone lags a minute: a run started right after its own preprocessing or a pip install (the
    quickstart from a fresh clone: load 0.9 on an otherwise idle 2-core machine) saw that work as another job's
    and trained on one thread, 1.64x slower. The sample alone would miss a job between two bursts; a machine
    that is busy now and was busy for the last minute is busy by both."""
    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        average = None
    known = [v for v in (average, busy_cpus_now()) if v is not None]
    return min(known) if known else None


def choose_threads(usable: int, load: float | None, ranks: int = 1) -> int:
    """Intra-op threads for one of `ranks` processes on `usable` CPUs that already run `load` (1-minute load
    average; the run itself has done nothing yet). A thread per idle CPU, at least one: a thread that has to share
    its core with another job stalls every matrix product it takes part in."""
    per_rank = max(1, usable // max(1, ranks))
    if load is None:
        return per_rank
    idle = usable - load
    return max(1, min(per_rank, math.floor(idle / max(1, ranks) + 0.5)))


def omp_threads() -> tuple[int | None, str]:
    """OMP_NUM_THREADS as (the thread count it sets, or None; the value as set, "" when unset). Only a positive
    whole number sets one: OpenMP ignores 0, -1, 1.5 or abc (libgomp says "Invalid value" and torch starts its
    default), so seqtrain chooses then as if it were unset, and says so."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    text = value.strip()
    return (int(text) if text.isdigit() and int(text) > 0 else None), value


def fit_threads(device_type: str, ranks: int = 1, program: str = "training") -> str | None:
    """Set torch's intra-op threads for a CPU run (see the module docstring) and return the line to log (naming
    `program`: training, generation); None on a GPU or when OMP_NUM_THREADS (a positive whole number) chose
    already."""
    given, value = omp_threads()
    if device_type != "cpu" or given is not None:
        return None
    usable, load = usable_cpus(), load_average()
    before = torch.get_num_threads()
    n = choose_threads(usable, load, ranks)
    torch.set_num_threads(n)
    where = f"{usable} usable CPU{'s' if usable > 1 else ''}, load {load:.1f}" if load is not None else ""
    where = where or f"{usable} usable CPU{'s' if usable > 1 else ''}"
    if value.strip():  # set, but to no thread count
        return (
            f"OMP_NUM_THREADS={value!r} is no positive number of threads (OpenMP ignores it): {program} uses {n} "
            f"intra-op thread{'s' if n > 1 else ''} ({where}); set it to 1 or more to choose yourself"
        )
    if n < before:
        return (
            f"the machine is busy ({where}): {program} uses {n} intra-op thread{'s' if n > 1 else ''} instead of "
            f"torch's {before}; set OMP_NUM_THREADS to choose yourself"
        )
    return f"intra-op threads: {n} ({where}; OMP_NUM_THREADS overrides)"


if __name__ == "__main__":
    # `python -m seqtrain.host_cpu`: the thread count a CPU run would choose now, for scripts that export
    # OMP_NUM_THREADS for every stage (scripts/quickstart.sh); the reason goes to stderr
    import sys

    cpus, load_now = usable_cpus(), load_average()
    print(choose_threads(cpus, load_now))
    load_text = f"{load_now:.1f}" if load_now is not None else "unknown"
    print(f"{cpus} usable CPUs, load {load_text}", file=sys.stderr)
