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
  "$py" - <<'EOF' || fail "no usable CUDA device (see the line above); this script needs one GPU"
import sys
try:
    import torch
except ImportError:
    sys.exit("torch is not installed for this interpreter (set PYTHON=...)")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda}, "
             f"CUDA_VISIBLE_DEVICES={__import__('os').environ.get('CUDA_VISIBLE_DEVICES')!r})")
p = torch.cuda.get_device_properties(0)
print(f"{torch.cuda.device_count()} device(s); using 0: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
      f"capability {p.major}.{p.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
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
