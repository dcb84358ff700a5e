#!/usr/bin/env bash
# Quickstart: from a fresh clone to a fine-tuned summarizer and its ROUGE in one command (about 8 minutes on an
# idle 2-core CPU). Needs Python 3.11 and pip; everything it writes goes to .quickstart/ (git-ignored).
#
#   scripts/quickstart.sh
#   UPDATES=1600 scripts/quickstart.sh     # fine-tune longer
#
# Stages: set up .venv -> preprocess the bundled sample (data/debdesc-sample: 5,000 train / 300 valid / 300 test
# Debian package descriptions -> synopses) with the tokenizer and dictionary of the bundled pretrained model ->
# fine-tune that model (models/debdesc-small-denoising: bart_small pretrained with BART's denoising task on the
# corpus' train descriptions by scripts/quality/pretrain.sh) for a fixed number of updates -> summarize the test
# split with beam search -> ROUGE next to the lead baseline.
#
# The budget is a number of updates, not minutes, so the result does not depend on how busy the machine is (a
# loaded machine only takes longer). Rerunning is safe: the data-bin is reused when it is complete, and training
# always starts from the pretrained model in a fresh .quickstart/checkpoints (to continue a run instead, call
# seqtrain-train with the same arguments and a save dir that holds checkpoint_last.pt).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work=".quickstart"
updates="${UPDATES:-800}"
pretrained="models/debdesc-small-denoising"
t0=$(date +%s)

stage() { echo; echo "==== [$(date +%H:%M:%S)] $*"; }

stage "1/5 setup: Python environment in ${SEQTRAIN_VENV:-.venv} (scripts/setup_env.sh; log: $work/setup.log)"
mkdir -p "$work"
if ! "$root/scripts/setup_env.sh" > "$work/setup.log" 2>&1; then
  tail -n 20 "$work/setup.log" >&2
  echo "quickstart.sh: error: setup failed (full log: $work/setup.log)" >&2
  exit 1
fi
grep "^\[setup\]" "$work/setup.log" || echo "[setup] reusing the environment"
# shellcheck disable=SC1091
. "${SEQTRAIN_VENV:-$root/.venv}/bin/activate"
# threads that fit the machine for every stage (seqtrain/host_cpu.py: one per idle usable CPU; on a busy
# 2-core machine torch's default of 2 made each update 3-5x slower); an OMP_NUM_THREADS you set wins
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  OMP_NUM_THREADS="$(python -m seqtrain.host_cpu 2> "$work/threads.txt")"
  export OMP_NUM_THREADS
  echo "OMP_NUM_THREADS=$OMP_NUM_THREADS ($(cat "$work/threads.txt"); set it yourself to override)"
fi
python -c "import seqtrain, torch; print(f'seqtrain ready (torch {torch.__version__}, {torch.get_num_threads()} threads)')"

stage "2/5 preprocess data/debdesc-sample -> $work/data-bin (the pretrained model's sentencepiece model and dictionary)"
# a joined data-bin names its dictionary after the source language (dict.source.txt; dict.txt is the
# monolingual layout): compare that one with the pretrained model's
if [ -f "$work/data-bin/preprocess.json" ] && cmp -s "$work/data-bin/dict.source.txt" "$pretrained/dict.txt" \
  && cmp -s "$work/data-bin/dict.target.txt" "$pretrained/dict.txt"; then
  echo "reusing $work/data-bin (delete it to preprocess again)"
else
  rm -rf "$work/data-bin"
  seqtrain-preprocess --trainpref data/debdesc-sample/train --validpref data/debdesc-sample/valid \
    --testpref data/debdesc-sample/test --destdir "$work/data-bin" --joined-dictionary \
    --spm-model "$pretrained/spm.model" --srcdict "$pretrained/dict.txt" --workers 2
fi

stage "3/5 fine-tune $pretrained for $updates updates (log: $work/train.log)"
rm -rf "$work/checkpoints" "$work/train.log" "$work/train.jsonl"
# configs/debdesc_small.yaml's model and batches; a pretrained start wants a lower peak lr (5e-4, not 1e-3) and
# a short warm-up
seqtrain-train "$work/data-bin" --config configs/debdesc_small.yaml --save-dir "$work/checkpoints" \
  --finetune-from-model "$pretrained" --max-update "$updates" --lr 0.0005 --warmup-updates 60 \
  --log-format tqdm --log-interval 20 --log-file "$work/train.log" --jsonl-log "$work/train.jsonl"
grep -h "| valid |" "$work/train.log" | tail -n 1 || true
echo "training curves: python scripts/quality/plot_curves.py $work/train.jsonl -o $work/curves.png (needs matplotlib)"

stage "4/5 summarize the 300 test descriptions with checkpoint_best.pt (beam 4)"
seqtrain-generate "$work/data-bin" --config configs/debdesc_small.yaml --path "$work/checkpoints/checkpoint_best.pt" \
  --gen-subset test --batch-size 64 --scoring rouge --quiet --results-path "$work/gen" | tee "$work/generate.txt"

stage "5/5 compare with the lead baseline (first sentence of the description, cut to 12 words)"
python scripts/quality/lead_baseline.py data/debdesc-sample/test --hypotheses "$work/gen/lead-test.txt" \
  --json "$work/gen/lead-test.json" > /dev/null
python - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
model = json.load(open(f"{work}/gen/rouge-test.json"))
lead = json.load(open(f"{work}/gen/lead-test.json"))
hyps = open(f"{work}/gen/hypotheses-test.txt", encoding="utf-8").read().splitlines()
refs = open(f"{work}/gen/references-test.txt", encoding="utf-8").read().splitlines()
srcs = open("data/debdesc-sample/test.source", encoding="utf-8").read().splitlines()
print(f"{'test split (300)':<34}{'ROUGE-1':>9}{'ROUGE-2':>9}{'ROUGE-Lsum':>12}")
for name, s in ((f"bart_small, {work}/checkpoints", model), ("lead baseline (1st sentence, 12 w)", lead)):
    print(f"{name:<34}{s['rouge1']:>9.2f}{s['rouge2']:>9.2f}{s['rougeLsum']:>12.2f}")
print("\nexamples (description -> reference | model):")
for i in range(3):
    print(f"- {srcs[i][:90]}...\n    reference: {refs[i]}\n    model:     {hyps[i]}")
EOF
echo
echo "done in $(( $(date +%s) - t0 )) s. Outputs: $work/gen/hypotheses-test.txt, $work/gen/rouge-test.json;"
echo "summarize your own text (one document per line, here 3 test descriptions):"
echo "  head -n 3 data/debdesc-sample/test.source | .venv/bin/seqtrain-generate --path $work/checkpoints/checkpoint_best.pt --input -"
echo "  .venv/bin/seqtrain-interactive --path $work/checkpoints/checkpoint_best.pt"
echo "The pretrained start is what lets 800 updates on 5,000 pairs beat the lead baseline (from scratch they do"
echo "not); scripts/quality/pretrain.sh made it, and docs/quality.md has the full-corpus recipes."
