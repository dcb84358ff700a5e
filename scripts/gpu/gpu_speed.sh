#!/usr/bin/env bash
# GPU speed run: the prepared runs that decide the speed work (issues 26, 27, 39, 49), at most TIMEOUT seconds
# (default 560) on one GPU, with only what the GPU image has. The stages (scripts/gpu/gpu_speed.py): GEMM and
# bandwidth ceilings, the vocabulary's alignment, attention kernels and the attention lever (cuDNN per shape
# bucket, FA3/FA4), packed against padded, one merged pass against 4 accumulated, seqtrain's training A/B,
# determinism, and the fair comparisons against transformers at its best (train_fair_large, train_fair_base,
# generate_fair: scripts/gpu/stage_fair.py), seqtrain-serve's benchmark when it is there. Results:
# $OUT/gpu_speed.json and $OUT/gpu_speed.md after every stage (default ./gpu-speed-out). The two prepared device
# calls of issue 49: docs/benchmarks.md, "The prepared fair run".
#
#   TIMEOUT=560 scripts/gpu/gpu_speed.sh      # PYTHON=... picks the interpreter (default .venv/bin/python, python3)
#   scripts/gpu/gpu_speed.sh --dry-run        # every stage on the CPU with tiny shapes (CI checks the plumbing)
#   scripts/gpu/gpu_speed.sh --stages ceilings,attention
#   TIMEOUT=287 scripts/gpu/gpu_speed.sh --plan --stages env,align,train_fair_large   # do they fit? (no device)
#
# gpu_speed.py gets what is left of TIMEOUT less 10 s as its own budget: a stage that no longer fits is
# skipped ("skipped: budget"), and its watchdog saves the results and stops 5 s past the budget, before the
# timeout below. Exits non-zero, with one line saying why, when no CUDA device is visible (without --dry-run) or
# a stage fails; a failed stage does not stop the later ones.
set -euo pipefail
out_default="$PWD/gpu-speed-out"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="python3"; fi
fi
fail() { echo "gpu_speed.sh: error: $*" >&2; exit 1; }

limit="${TIMEOUT:-560}"
for a in "$@"; do  # the stages' budgets against TIMEOUT less the device probe (~5 s) and 10 s; nothing run
  [ "$a" = "--plan" ] && exec "$py" scripts/gpu/gpu_speed.py --budget "$((limit - 15))" "$@"
done
dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
if [ "$dry" = 0 ]; then
  "$py" scripts/gpu/cuda_probe.py || fail "no usable CUDA device (see the line above); this script needs one GPU"
fi
export OUT="${OUT:-$out_default}"
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS for determinism
mkdir -p "$OUT"
left=$((limit - SECONDS))
[ "$left" -gt 20 ] || fail "TIMEOUT=$limit leaves $left s after the device probe"
status=0
timeout "$left" "$py" scripts/gpu/gpu_speed.py --out "$OUT" --budget "$((left - 10))" "$@" || status=$?
[ "$status" = 124 ] && fail "stopped at the time budget; the stages that ran are in $OUT/gpu_speed.json and .md"
[ "$status" = 0 ] || fail "gpu_speed.py exited $status; see $OUT/gpu_speed.md"
echo "gpu_speed.sh: no stage failed (results in $OUT)"
