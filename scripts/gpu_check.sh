#!/usr/bin/env bash
# GPU check, about 5-8 minutes on one GPU: (1) the CUDA-marked tests, (2) bart_base trained for a fixed number of
# updates in bf16 and in fp16 on the bundled debdesc sample, printing tokens/s and MFU, (3) beam search speed on
# the GPU. Exits non-zero, with one line saying why, when no CUDA device is visible or a stage fails.
#
#   scripts/gpu_check.sh                   # PYTHON=... picks the interpreter (default .venv/bin/python, python3)
#   UPDATES=100 PEAK_FLOPS=989e12 scripts/gpu_check.sh
#
# PEAK_FLOPS is the device's dense bf16/fp16 tensor peak (FLOP/s); by default it is looked up from the device
# name (H100/H200 SXM 989e12, H100 PCIe 756e12, A100 312e12, L40S 362e12, L4 121e12, A10 125e12, V100 125e12).
# MFU is printed twice: seqtrain-train's `mfu` (6 x parameters x target tokens/s, its documented rough figure)
# and an estimate that also counts the source tokens the encoder reads (6 x (encoder parameters x source
# tokens/s + decoder and output-layer parameters x target tokens/s)); debdesc sources are ~7x longer than
# targets, so the second is the meaningful one here. Attention-score FLOPs are not counted in either.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="python3"; fi
fi
work="${WORK:-/tmp/seqtrain-gpu-check}"
updates="${UPDATES:-80}"
max_tokens="${MAX_TOKENS:-16384}"
t0=$(date +%s)

stage() { echo; echo "==== [$(date +%H:%M:%S)] $*"; }
fail() { echo "gpu_check.sh: error: $*" >&2; exit 1; }

stage "0/4 CUDA device"
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
      f"capability {p.major}.{p.minor}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}; "
      f"torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
if [ -z "${PEAK_FLOPS:-}" ]; then
  PEAK_FLOPS="$("$py" - <<'EOF'
import torch
name = torch.cuda.get_device_name(0).upper()
table = [("H200", 989e12), ("H100 PCIE", 756e12), ("H100", 989e12), ("H800", 989e12), ("A100", 312e12),
         ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10", 125e12), ("V100", 125e12)]
print(next((f"{peak:g}" for key, peak in table if key in name), ""))
EOF
)"
fi
echo "peak FLOP/s for MFU: ${PEAK_FLOPS:-unknown (set PEAK_FLOPS=...; MFU not printed)}"

stage "1/4 CUDA-marked tests (pytest -m cuda)"
timeout 300 "$py" -m pytest -q -m cuda tests -p no:cacheprovider || fail "CUDA tests failed (exit $?)"

stage "2/4 data: preprocess data/debdesc-sample -> $work/data-bin"
mkdir -p "$work"
if [ ! -f "$work/data-bin/preprocess.json" ]; then
  rm -rf "$work/data-bin"
  "$py" -m seqtrain_cli.preprocess --trainpref data/debdesc-sample/train --validpref data/debdesc-sample/valid \
    --destdir "$work/data-bin" --joined-dictionary --spm-vocab-size 4000 --workers 4 --no-progress-bar > "$work/preprocess.log" \
    || fail "preprocessing failed; see $work/preprocess.log"
fi
echo "data-bin ready ($(grep -c . "$work/data-bin/dict.source.txt") dictionary lines)"

stage "3/4 train bart_base for $updates updates in bf16 and in fp16 (max-tokens $max_tokens)"
for prec in bf16 fp16; do
  rm -rf "$work/ckpt-$prec" "$work/train-$prec.log"
  peak=()
  [ -n "${PEAK_FLOPS:-}" ] && peak=(--peak-flops "$PEAK_FLOPS")
  start=$(date +%s)
  "$py" -m seqtrain_cli.train "$work/data-bin" --arch bart_base --task translation --"$prec" "${peak[@]}" \
    --truncate-source --max-source-positions 512 --max-target-positions 128 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --optimizer adam --adam-betas "(0.9, 0.98)" \
    --lr 3e-4 --lr-scheduler inverse_sqrt --warmup-updates 20 --clip-norm 1.0 --dropout 0.1 \
    --max-tokens "$max_tokens" --max-update "$updates" --disable-validation --log-format simple --log-interval 20 \
    --save-dir "$work/ckpt-$prec" --no-epoch-checkpoints --no-save-optimizer-state --num-workers 2 \
    --log-file "$work/train-$prec.log" > "$work/train-$prec.stdout" 2>&1 \
    || { tail -n 5 "$work/train-$prec.stdout" >&2; fail "$prec training failed; see $work/train-$prec.stdout"; }
  "$py" - "$work" "$prec" "${PEAK_FLOPS:-}" "$(( $(date +%s) - start ))" <<'EOF' || fail "could not read the $prec training log"
import json, re, sys
work, prec, peak, seconds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
lines = [l for l in open(f"{work}/train-{prec}.log", encoding="utf-8") if "| train_inner |" in l]
if len(lines) < 2:
    sys.exit(f"{prec}: fewer than 2 train_inner lines in {work}/train-{prec}.log")
stats = dict(re.findall(r"(\w+)=([^,\s]+)", lines[-1]))  # the last interval: past warm-up and compilation
wps, ups = float(stats["wps"]), float(stats["ups"])
out = (f"{prec}: {wps:,.0f} target tokens/s, {ups:.2f} updates/s, {float(stats['wpb']):,.0f} target tokens and "
       f"{float(stats['bsz']):.0f} sentences per update, loss {stats['loss']} at update {stats['num_updates']} "
       f"({seconds} s with start-up)")
if peak:
    import os
    import numpy as np
    import torch
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    ck = torch.load(f"{work}/ckpt-{prec}/checkpoint_last.pt", map_location="cpu", weights_only=True)
    model = ck["model"]
    enc = sum(v.numel() for k, v in model.items() if k.startswith("encoder.") and "embed_positions" not in k
              and "embed_tokens" not in k)
    dec = sum(v.numel() for k, v in model.items() if k.startswith("decoder.") and "embed_positions" not in k
              and "embed_tokens" not in k and "output_projection" not in k)
    vocab, dim = model["decoder.embed_tokens.weight"].shape
    # source tokens per target token of the train split (sources cut at 512 as in training)
    src = np.minimum(MMapIndexedDataset(f"{work}/data-bin/train.source-target.source").sizes, 512).sum()
    tgt = MMapIndexedDataset(f"{work}/data-bin/train.source-target.target").sizes.sum()
    ratio = float(src) / float(tgt)
    flops = 6.0 * (enc * wps * ratio + (dec + vocab * dim) * wps)
    out += (f"\n      MFU: seqtrain-train's (target tokens only) {stats.get('mfu', 'n/a')}; counting source tokens "
            f"too ({ratio:.1f} per target token) {flops / float(peak):.3f} of {float(peak):.3g} FLOP/s")
print(out)
EOF
done

stage "4/4 beam search on the GPU (seqtrain-generate, bf16 checkpoint, 300 valid sentences)"
"$py" -m seqtrain_cli.generate "$work/data-bin" --path "$work/ckpt-bf16/checkpoint_last.pt" --gen-subset valid \
  --beam 4 --max-len-b 60 --no-repeat-ngram-size 3 --batch-size 64 --quiet --bf16 > "$work/generate.txt" 2>&1 \
  || { tail -n 5 "$work/generate.txt" >&2; fail "generation failed; see $work/generate.txt"; }
grep "^Generated" "$work/generate.txt"
if "$py" scripts/bench_generate.py --help 2>/dev/null | grep -q -- "--device"; then
  timeout 300 "$py" scripts/bench_generate.py --device cuda --quick || fail "scripts/bench_generate.py --device cuda failed"
else
  echo "note: scripts/bench_generate.py has no --device flag (it benchmarks on the CPU); not run here"
fi

echo
echo "gpu_check.sh: all stages passed in $(( $(date +%s) - t0 )) s (logs in $work)"
