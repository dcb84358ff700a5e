#!/usr/bin/env bash
# GPU check: one prepared run, at most 10 minutes on one GPU, that proves the GPU path with only what the GPU
# image has (torch with CUDA, transformers, sentencepiece, pytest; no rouge-score, nltk or network). The stages
# (scripts/gpu/gpu_check.py): the CUDA tests, fp16/bf16 numerics of the custom autograd functions and of the loss
# at V = 50,265, the sync count, training speed against transformers (bart_base, bart_large; tokens/s, ms/step,
# peak memory, MFU, step-0 loss), fp16 resume, OOM recovery, beam search against transformers' generate, and
# torch.compile's graph breaks. Results: $OUT/gpu_check.json and $OUT/gpu_check.md (default ./gpu-check-out).
#
#   scripts/gpu/gpu_check.sh                  # PYTHON=... picks the interpreter (default .venv/bin/python, python3)
#   scripts/gpu/gpu_check.sh --dry-run        # every stage on the CPU with tiny shapes (CI checks the plumbing)
#   scripts/gpu/gpu_check.sh --stages numerics,train_speed --peak-flops 989e12
#
# Exits non-zero, with one line saying why, when no CUDA device is visible (without --dry-run) or a stage fails;
# a failed stage does not stop the later ones.
set -euo pipefail
out_default="$PWD/gpu-check-out"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="python3"; fi
fi
fail() { echo "gpu_check.sh: error: $*" >&2; exit 1; }

dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
if [ "$dry" = 0 ]; then
  "$py" scripts/gpu/cuda_probe.py || fail "no usable CUDA device (see the line above); this script needs one GPU"
fi
export OUT="${OUT:-$out_default}"
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS for the resume stage
mkdir -p "$OUT"
# the whole check stays within 10 minutes; gpu_check.py writes its JSON after every stage, so a timeout keeps
# what ran
status=0
timeout "${TIMEOUT:-590}" "$py" scripts/gpu/gpu_check.py --out "$OUT" "$@" || status=$?
[ "$status" = 124 ] && fail "stopped after ${TIMEOUT:-590} s; the stages that ran are in $OUT/gpu_check.json"
[ "$status" = 0 ] || fail "gpu_check.py exited $status; see $OUT/gpu_check.md"
echo "gpu_check.sh: all stages passed (results in $OUT)"
