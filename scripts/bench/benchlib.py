"""Memory measurement shared by the benchmark scripts (bench_train.py and bench_generate.py import it as a
sibling module: `import benchlib`).

PeakRSS is the peak resident set size of this process while a block runs, above the level at its start. On
Linux the kernel's high-water mark (VmHWM) is reset as the block starts (/proc/self/clear_refs, Linux >= 4.0)
and read as it ends, so no short-lived peak is missed; where that reset is refused, a thread samples the RSS
every 2 ms instead (torch ops release the GIL). For figures that follow what tensors hold, call
`follow_tensors_with_rss()` once at start-up and `release_free_heap()` after freeing what should not count.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

MIB = 2**20


def _status_bytes(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field} line")


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """with PeakRSS() as mem: ...  then mem.increase (bytes above the start level), mem.peak, mem.base.
    mem.mark() inside the block remembers the peak so far (mem.marked_increase)."""

    def __enter__(self) -> PeakRSS:
        self.marked: int | None = None
        self.kernel_peak = _reset_high_water_mark()
        self.base = self.peak = _status_bytes("VmRSS")
        self._thread: threading.Thread | None = None
        if not self.kernel_peak:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _status_bytes("VmRSS"))

    def _peak_now(self) -> int:
        # the kernel updates VmHWM lazily (per-thread RSS counters), so the current RSS and the mark count too
        high = _status_bytes("VmHWM") if self.kernel_peak else self.peak
        return max(high, _status_bytes("VmRSS"), self.marked or 0)

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self.peak = self._peak_now()

    def mark(self) -> None:
        self.marked = self._peak_now()

    @property
    def increase(self) -> int:
        return self.peak - self.base

    @property
    def marked_increase(self) -> int:
        return (self.peak if self.marked is None else self.marked) - self.base


def follow_tensors_with_rss() -> None:
    """glibc: large blocks straight from mmap and back to the OS on free, so the RSS follows what tensors hold
    (the adaptive threshold would otherwise keep freed activations in the heap)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 16)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def release_free_heap() -> None:
    """Hand freed heap back to the OS (glibc malloc_trim): a later peak cannot hide in memory freed earlier."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_weights_(model: Any, eos_scale: float, pad: int = 1, eos: int = 2) -> None:
    """Random weights in place (the torch seed is the caller's) with a peaked next-token distribution, and an EOS
    embedding scaled by `eos_scale` so that hypotheses end at varied lengths: a benchmark's model that decodes
    like a trained one without training it."""
    import torch  # the other helpers here need no torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            elif p.dim() == 1:
                p.normal_(0.0, 0.1)
            elif "embed_tokens" in name:
                p.normal_(0.0, 0.3)
            elif "embed_positions" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.size(1) ** -0.5)
        emb = model.encoder.embed_tokens.weight
        emb[pad].zero_()
        emb[eos] *= eos_scale
