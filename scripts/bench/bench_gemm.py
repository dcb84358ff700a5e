"""The matrix products of a BART beam search on this CPU, per backend: torch's F.linear (MKL), oneDNN's packed
linear (what the compiled CPU step runs on CPUs other than Intel's: seqtrain.models.cpu_products), and the
dynamic int8 linear packed for fbgemm and for oneDNN (--compute-type int8). One row per shape: the batch's rows
M (beam x sentences, or source tokens for the encoder) x input K -> output N.

    PYTHONPATH=. python scripts/bench/bench_gemm.py                    # bart_small's shapes, 1 thread
    PYTHONPATH=. python scripts/bench/bench_gemm.py --size base --threads 2
    PYTHONPATH=. python scripts/bench/bench_gemm.py --rows             # a weight packed once, as rows leave

--rows answers whether a weight packed for one row count is packed again on every call with another (as
finished sentences leave the batch, a search's row count falls every few steps): oneDNN's packed linear at
M = 128 ... 1 with the weight packed for 128 rows, against packed for that M.

GFLOP/s = 2 M K N / time. The peak to compare with: cores x clock x 32 fp32 flops a cycle on AVX2 CPUs with two
FMA units (Zen 3, Skylake and later), 64 with AVX-512 and two FMA units. --clock process times this process's
CPU seconds (one thread on a machine other work loads).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from seqtrain.models.cpu_products import LinearSpec, cpu_vendor, run_linear  # noqa: E402
from seqtrain.models.int8 import Int8Linear  # noqa: E402

SHAPES = {  # (what, M, K, N) at beam 4, batches of 32, 48-token sources
    "small": (
        ("encoder q/k/v, out, 32 x 48 tokens", 1536, 256, 256),
        ("encoder FFN in", 1536, 256, 1024),
        ("decoder self-attn q/k/v fused, 128 rows", 128, 256, 768),
        ("decoder FFN in, 128 rows", 128, 256, 1024),
        ("decoder FFN out, 128 rows", 128, 1024, 256),
        ("output projection, 128 rows x 4,008", 128, 256, 4008),
        ("output projection, 128 rows x 8,008", 128, 256, 8008),
    ),
    "base": (
        ("encoder q/k/v, out, 32 x 48 tokens", 1536, 768, 768),
        ("encoder FFN in", 1536, 768, 3072),
        ("decoder self-attn q/k/v fused, 128 rows", 128, 768, 2304),
        ("decoder FFN in, 128 rows", 128, 768, 3072),
        ("decoder FFN out, 128 rows", 128, 3072, 768),
        ("output projection, 128 rows x 50,265", 128, 768, 50265),
    ),
}
CLOCK = time.perf_counter


def median_seconds(fn, seconds: float) -> float:
    """Median seconds of fn() over repeats filling about `seconds`."""
    for _ in range(3):
        fn()
    t = CLOCK()
    fn()
    one = max(CLOCK() - t, 1e-6)
    times = []
    for _ in range(max(5, int(seconds / one))):
        t = CLOCK()
        fn()
        times.append(CLOCK() - t)
    return sorted(times)[len(times) // 2]


def int8_linear(w: torch.Tensor, engine: str) -> Int8Linear:
    """An Int8Linear packed for `engine` (fbgemm or onednn)."""
    old = os.environ.get("SEQTRAIN_CPU_GEMM")
    os.environ["SEQTRAIN_CPU_GEMM"] = "onednn" if engine == "onednn" else "mkl"
    try:
        return Int8Linear(w, None)
    finally:
        if old is None:
            os.environ.pop("SEQTRAIN_CPU_GEMM")
        else:
            os.environ["SEQTRAIN_CPU_GEMM"] = old


def backends(m: int, k: int, n: int, seconds: float) -> dict[str, float]:
    """GFLOP/s of each backend at one shape (int8: GOP/s)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * k**-0.5
    packed = LinearSpec.of(w, None, "onednn", m) if torch.backends.mkldnn.is_available() else None
    runs = {"MKL F.linear": lambda: F.linear(x, w)}
    if packed is not None:
        runs["oneDNN packed"] = lambda: run_linear(packed, x)
    engines = torch.backends.quantized.supported_engines
    for engine in ("fbgemm", "onednn"):
        if engine in engines:
            q = int8_linear(w, engine)
            runs[f"int8 {engine}"] = lambda q=q: q(x)
    return {name: 2 * m * k * n / median_seconds(fn, seconds) / 1e9 for name, fn in runs.items()}


def rows_sweep(size: str, seconds: float) -> None:
    print("| shape | M | packed for 128 rows: GFLOP/s | packed for M rows: GFLOP/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for what, m0, k, n in SHAPES[size]:
        if m0 != 128:
            continue
        w = torch.randn(n, k) * k**-0.5
        once = LinearSpec.of(w, None, "onednn", 128)
        for m in (128, 96, 64, 32, 16, 8, 4, 1):
            x = torch.randn(m, k)
            own = LinearSpec.of(w, None, "onednn", m)
            a = 2 * m * k * n / median_seconds(lambda x=x: run_linear(once, x), seconds) / 1e9  # noqa: B023
            b = 2 * m * k * n / median_seconds(lambda x=x, own=own: run_linear(own, x), seconds) / 1e9
            print(f"| {what} | {m} | {a:.1f} | {b:.1f} | {a / b:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5, help="time spent on each shape and backend")
    ap.add_argument("--rows", action="store_true", help="the packed weight at falling row counts (see above)")
    ap.add_argument("--clock", choices=["wall", "process"], default="wall")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    torch.set_num_threads(args.threads)
    print(
        f"# {platform.processor() or platform.machine()} ({cpu_vendor() or 'vendor unknown'}), torch "
        f"{torch.__version__}, {args.threads} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"load average {os.getloadavg()[0]:.1f}, clock {args.clock}"
    )
    if args.rows:
        return rows_sweep(args.size, args.seconds)
    names = list(backends(8, 16, 16, 0.01))
    print("| shape | M | K | N | " + " | ".join(f"{n} GFLOP/s" for n in names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for what, m, k, n in SHAPES[args.size]:
        rates = backends(m, k, n, args.seconds)
        print(f"| {what} | {m} | {k} | {n} | " + " | ".join(f"{rates[x]:.1f}" for x in names) + " |")


if __name__ == "__main__":
    main()
