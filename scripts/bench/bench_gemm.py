"""How close torch's fp32 matrix products come to this CPU's peak at the shapes a BART beam search runs
(issue 37: is a faster GEMM backend part of CTranslate2's lead?). F.linear, as the model calls it, one row per
shape: the batch's rows M (beam x sentences, or source tokens for the encoder) x input K -> output N.

    PYTHONPATH=. python scripts/bench/bench_gemm.py                    # bart_small's shapes, 1 thread
    PYTHONPATH=. python scripts/bench/bench_gemm.py --size base --threads 2

GFLOP/s = 2 M K N / time. The peak to compare with: cores x clock x 32 fp32 flops a cycle on AVX2 CPUs with two
FMA units (Zen 3, Skylake and later), 64 with AVX-512 and two FMA units.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

SHAPES = {  # (what, M, K, N) at beam 4, batches of 32, 48-token sources
    "small": (
        ("encoder q/k/v, out, 32 x 48 tokens", 1536, 256, 256),
        ("encoder FFN in", 1536, 256, 1024),
        ("decoder self-attn q/k/v fused, 128 rows", 128, 256, 768),
        ("decoder FFN in, 128 rows", 128, 256, 1024),
        ("decoder FFN out, 128 rows", 128, 1024, 256),
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


def time_linear(m: int, k: int, n: int, seconds: float) -> float:
    """Median seconds of one F.linear(x[m, k], w[n, k]) over repeats filling about `seconds`."""
    x, w = torch.randn(m, k), torch.randn(n, k)
    for _ in range(3):
        F.linear(x, w)
    t = time.perf_counter()
    F.linear(x, w)
    one = max(time.perf_counter() - t, 1e-6)
    times = []
    for _ in range(max(5, int(seconds / one))):
        t = time.perf_counter()
        F.linear(x, w)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="small")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5, help="time spent on each shape")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s),"
    )
    print(
        f"# CPU capability {torch.backends.cpu.get_cpu_capability()}, BLAS: MKL {torch.backends.mkl.is_available()}"
    )
    print("| shape | M | K | N | ms | GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for what, m, k, n in SHAPES[args.size]:
        dt = time_linear(m, k, n, args.seconds)
        print(f"| {what} | {m} | {k} | {n} | {dt * 1e3:.3f} | {2 * m * k * n / dt / 1e9:.1f} |")


if __name__ == "__main__":
    main()
