"""The server's figures in Prometheus' text exposition format (version 0.0.4), for GET /metrics.

Counters and histograms are updated from the event loop and the batching worker alike, under one lock; a
scrape renders them as they are. Label values come from a small fixed set (routes, status codes), so the series
stay few. The process' resident memory is read from /proc at each scrape (bench_serve.py's soak row watches it).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in pairs)
    return "{" + inner + "}"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        i = next((i for i, b in enumerate(self.buckets) if v <= b), len(self.buckets))
        self.counts[i] += 1
        self.sum += v

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for b, c in zip((*self.buckets, math.inf), self.counts):
            total += c
            out.append(f'{name}_bucket{{le="{_value(b)}"}} {total}')
        return out + [f"{name}_sum {_value(self.sum)}", f"{name}_count {total}"]


class Metrics:
    """What /metrics reports; `queue_depth`, `in_flight` and `ready` are read through callables at scrape time."""

    def __init__(self, window_s: float = 60.0):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}  # (route, status) -> count
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.batches = {"ok": 0, "error": 0}
        self.summaries = 0
        self.tokens = 0
        self._recent: deque[tuple[float, int]] = deque()  # (time, texts) of recent batches: summaries/s
        self.window_s = window_s
        self.gauges: dict[str, tuple[str, object]] = {}  # name -> (help, callable)

    def request(self, route: str, status: int, seconds: float | None) -> None:
        with self._lock:
            key = (route, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            if seconds is not None:
                self.latency.observe(seconds)

    def batch(self, texts: int, tokens: int, ok: bool) -> None:
        now = time.monotonic()
        with self._lock:
            self.batches["ok" if ok else "error"] += 1
            self.batch_size.observe(texts)
            if ok:
                self.summaries += texts
                self.tokens += tokens
                self._recent.append((now, texts))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def rate(self) -> float:
        """Summaries per second over the last window (0 when none)."""
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            return sum(n for _, n in self._recent) / self.window_s

    def gauge(self, name: str, help_text: str, read) -> None:
        self.gauges[name] = (help_text, read)

    def render(self) -> str:
        rate = self.rate()
        with self._lock:
            out = [
                "# HELP seqtrain_serve_requests_total HTTP requests answered, by route and status code "
                "(499: the client closed the connection first)",
                "# TYPE seqtrain_serve_requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                out.append(
                    f"seqtrain_serve_requests_total{_labels((('route', route), ('code', status)))} {n}"
                )
            out += [
                "# HELP seqtrain_serve_request_duration_seconds time to answer POST /v1/summarize (200s only)",
                "# TYPE seqtrain_serve_request_duration_seconds histogram",
                *self.latency.lines("seqtrain_serve_request_duration_seconds"),
                "# HELP seqtrain_serve_batch_size texts per generation batch",
                "# TYPE seqtrain_serve_batch_size histogram",
                *self.batch_size.lines("seqtrain_serve_batch_size"),
                "# HELP seqtrain_serve_batches_total generation batches run, by outcome",
                "# TYPE seqtrain_serve_batches_total counter",
                *(f'seqtrain_serve_batches_total{{outcome="{k}"}} {v}' for k, v in self.batches.items()),
                "# HELP seqtrain_serve_summaries_total texts summarized",
                "# TYPE seqtrain_serve_summaries_total counter",
                f"seqtrain_serve_summaries_total {self.summaries}",
                "# HELP seqtrain_serve_generated_tokens_total tokens generated (every returned hypothesis)",
                "# TYPE seqtrain_serve_generated_tokens_total counter",
                f"seqtrain_serve_generated_tokens_total {self.tokens}",
                f"# HELP seqtrain_serve_summaries_per_second texts summarized per second over the last "
                f"{_value(self.window_s)} s",
                "# TYPE seqtrain_serve_summaries_per_second gauge",
                f"seqtrain_serve_summaries_per_second {_value(rate)}",
            ]
        for name, (help_text, read) in self.gauges.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {_value(float(read()))}"]
        rss = resident_bytes()
        if rss is not None:
            out += [
                "# HELP process_resident_memory_bytes resident memory of the server process",
                "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {rss}",
            ]
        return "\n".join(out) + "\n"


def resident_bytes() -> int | None:
    """This process' resident set size (Linux /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
