#!/usr/bin/env bash
# Quality run: bart_small trained from scratch on the full debdesc train split (53,332 pairs) for 30 minutes of
# CPU time budget, then beam search on the full valid split (3,024 pairs) and ROUGE next to the lead baseline.
# The figures in docs/quality.md come from this script.
#
#   scripts/quality/quality_run.sh                      # DEBDESC=../shared/data/debdesc by default
#   MINUTES=10 RUN=short scripts/quality/quality_run.sh --lr 0.001   # a shorter budget; extra flags go to seqtrain-train
#
# Only train and valid are used: the recipe was chosen with short pilot runs scored on valid loss, the curves
# come from a fixed random 500-pair subset of valid (valid1), and ROUGE is reported on all of valid.
# Rerunning continues from checkpoints/$RUN/checkpoint_last.pt (fairseq's resume); the time budget is
# cumulative, so a finished run stops at once and only generation and scoring run again. FRESH=1 starts over.
#
# Pretrain, then fine-tune (docs/quality.md): PRETRAINED=folder fine-tunes a model pretrained by
# scripts/quality/pretrain.sh instead of training from scratch (its sentencepiece model and dictionary make the
# data-bin, data-bin/debdesc-$RUN), at lr 5e-4; UPDATES=N gives a budget of N updates instead of MINUTES:
#   RUN=pretrained PRETRAINED=models/debdesc-small-denoising UPDATES=1200 scripts/quality/quality_run.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${SEQTRAIN_VENV:-$root/.venv}/bin/python"
bin="$(dirname "$py")"
data="${DEBDESC:-$root/../shared/data/debdesc}"
minutes="${MINUTES:-30}"
run="${RUN:-quality}"
pretrained="${PRETRAINED:-}"
databin="data-bin/debdesc"
tokenizer=(--spm-vocab-size 8000 --spm-num-threads 2)
init=()
if [ -n "$pretrained" ]; then
  [ -f "$pretrained/spm.model" ] && [ -f "$pretrained/dict.txt" ] || {
    echo "quality_run.sh: error: PRETRAINED=$pretrained: no spm.model and dict.txt there (scripts/quality/pretrain.sh makes them)" >&2; exit 1; }
  databin="data-bin/debdesc-$run"
  tokenizer=(--spm-model "$pretrained/spm.model" --srcdict "$pretrained/dict.txt")
  init=(--finetune-from-model "$pretrained" --lr 0.0005)
fi
budget=(--stop-time-hours "$("$py" -c "print($minutes / 60)")")
what="${minutes}-minute budget"
if [ -n "${UPDATES:-}" ]; then
  budget=(--max-update "$UPDATES")
  what="$UPDATES updates"
fi
save="checkpoints/$run"
out="logs/$run"
mkdir -p "$out"

stage() { echo; echo "==== [$(date +%H:%M:%S)] $*"; }

for f in train.source train.target valid.source valid.target; do
  [ -f "$data/$f" ] || { echo "quality_run.sh: error: $data/$f not found (set DEBDESC=folder of the corpus)" >&2; exit 1; }
done

stage "1/5 preprocess $data -> $databin (${pretrained:+the tokenizer and dictionary of $pretrained; }joined dictionary)"
if [ -f "$databin/preprocess.json" ] && [ -f "$databin/valid1.source-target.source.idx" ]; then
  echo "reusing $databin"
else
  raw="data-bin/debdesc.raw"
  mkdir -p "$raw"
  # valid1: a fixed random 500-pair subset of valid, for cheap validation curves during training
  "$py" - "$data" "$raw" <<'EOF'
import random, sys
data, raw = sys.argv[1], sys.argv[2]
for side in ("source", "target"):
    with open(f"{data}/valid.{side}", encoding="utf-8") as f:
        lines = f.read().split("\n")[:-1]
    keep = sorted(random.Random(0).sample(range(len(lines)), 500))
    with open(f"{raw}/valid500.{side}", "w", encoding="utf-8") as f:
        f.writelines(lines[i] + "\n" for i in keep)
EOF
  "$bin/seqtrain-preprocess" --trainpref "$data/train" --validpref "$data/valid,$raw/valid500" \
    --destdir "$databin" --joined-dictionary "${tokenizer[@]}" --workers 2
fi

stage "2/5 train bart_small ${pretrained:+from $pretrained}${pretrained:-from scratch}, $what (log: $out/train.log)"
[ "${FRESH:-0}" = 1 ] && rm -rf "$save" "$out/train.log"
start=$(date +%s)
"$bin/seqtrain-train" "$databin" --config configs/debdesc_small.yaml --bf16 "${init[@]}" \
  --save-dir "$save" "${budget[@]}" \
  --valid-subset valid1 --save-interval-updates 100 --keep-interval-updates 1 \
  --log-format json --log-interval 10 --log-file "$out/train.log" --tensorboard-logdir "$out/tb" \
  "$@" > "$out/train.stdout" 2>&1
echo "training took $(( $(date +%s) - start )) s of wall clock; $(grep -c train_inner "$out/train.log") log lines"
grep "done training" "$out/train.log" | tail -n 1 || true

stage "3/5 generate on valid (3,024 pairs) with checkpoint_best.pt, beam 4"
start=$(date +%s)
"$bin/seqtrain-generate" "$databin" --config configs/debdesc_small.yaml --path "$save/checkpoint_best.pt" \
  --gen-subset valid --batch-size 64 --max-tokens 16384 --scoring rouge --quiet --results-path "$out/gen" \
  | tee "$out/generate.txt"
echo "generation took $(( $(date +%s) - start )) s"

stage "4/5 lead baseline on valid (first sentence, 12 words)"
"$py" scripts/quality/lead_baseline.py "$data/valid" --json "$out/lead.json" | tee "$out/lead.txt"

stage "5/5 training curves -> $out/curves.png"
if "$py" -c "import matplotlib" 2>/dev/null; then
  "$py" scripts/quality/plot_curves.py "$out/train.log" -o "$out/curves.png" \
    --title "debdesc: bart_small ${pretrained:+fine-tuned from $pretrained}${pretrained:-from scratch}, $what (valid1 = 500 valid pairs)"
else
  echo "matplotlib is missing (pip install -e .[plot]); skipping the plot"
fi
