#!/usr/bin/env bash
# BART's own pretraining on a CPU: bart_small learns to rebuild noised debdesc train *descriptions*
# (--task denoising, configs/debdesc_pretrain.yaml), and is exported as the small pretrained model the
# quickstart fine-tunes: models/debdesc-small-denoising/ (Hugging Face folder, float16 safetensors, mBART layout,
# with its sentencepiece model and dict.txt). This script made the folder in the repository.
#
#   scripts/quality/pretrain.sh                    # DEBDESC=../shared/data/debdesc UPDATES=3000
#   UPDATES=1500 OUT=models/mine scripts/quality/pretrain.sh
#
# Only the train split's descriptions are read: no synopsis, nothing of valid or test (the quickstart's test pairs
# come from the corpus' valid split). About 22 minutes on an idle 2-core CPU with --bf16 autocast (AVX512-BF16);
# rerunning continues from checkpoints/$RUN/checkpoint_last.pt, FRESH=1 starts over.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${SEQTRAIN_VENV:-$root/.venv}/bin/python"
bin="$(dirname "$py")"
data="${DEBDESC:-$root/../shared/data/debdesc}"
updates="${UPDATES:-3000}"
run="${RUN:-pretrain}"
out="${OUT:-models/debdesc-small-denoising}"
raw="data-bin/debdesc-mono.raw"
databin="data-bin/debdesc-mono"
save="checkpoints/$run"
[ -f "$data/train.source" ] || { echo "pretrain.sh: error: $data/train.source not found (set DEBDESC=folder of the corpus)" >&2; exit 1; }
mkdir -p "logs/$run"

stage() { echo; echo "==== [$(date +%H:%M:%S)] $*"; }

stage "1/3 $data/train.source -> $databin (one sentence per line; sentencepiece 4000, --only-source)"
if [ -f "$databin/preprocess.json" ]; then
  echo "reusing $databin"
else
  "$py" scripts/quality/pretrain_text.py "$data/train.source" "$raw"
  "$bin/seqtrain-preprocess" --only-source --trainpref "$raw/train" --validpref "$raw/valid" --destdir "$databin" \
    --spm-vocab-size 4000 --workers 2 --spm-num-threads 2
fi

stage "2/3 pretrain bart_small with --task denoising for $updates updates (log: logs/$run/train.log)"
[ "${FRESH:-0}" = 1 ] && rm -rf "$save" "logs/$run/train.log"
bf16=()
"$py" -c "import torch, sys; sys.exit(0 if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() else 1)" 2>/dev/null && bf16=(--bf16)
"$bin/seqtrain-train" "$databin" --config configs/debdesc_pretrain.yaml "${bf16[@]}" --max-update "$updates" \
  --save-dir "$save" --save-interval-updates 500 --keep-interval-updates 2 \
  --log-format json --log-interval 25 --log-file "logs/$run/train.log" > "logs/$run/train.stdout" 2>&1
grep -h "| valid |" "logs/$run/train.log" | tail -n 1 || true

stage "3/3 export $save/checkpoint_last.pt -> $out (float16, Hugging Face folder + dict.txt)"
tmp="$(dirname "$out")/.export-tmp"   # the same folder name inside, so the model card names the real folder
rm -rf "$tmp"
mkdir -p "$tmp"
"$bin/seqtrain-convert" --to hf --dtype float16 "$save/checkpoint_last.pt" "$tmp/$(basename "$out")"
cp "$databin/dict.txt" "$tmp/$(basename "$out")/dict.txt"   # the dictionary without <mask>, for fine-tuning data-bins
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
# the export's card is a summarizer's: this model is pretrained only (it rebuilds text; fine-tune it to summarize).
# Its pipeline_tag stays summarization (what it is fine-tuned for): transformers 5 removed text2text-generation
sed -i -e 's/^# BART summarizer (exported by seqtrain)$/# bart_small pretrained on debdesc descriptions (denoising only, not fine-tuned)/' \
  "$tmp/$(basename "$out")/README.md"
cat >> "$tmp/$(basename "$out")/README.md" <<CARD

## How it was made
\`scripts/quality/pretrain.sh\` (UPDATES=$updates; exported at seqtrain commit $commit): bart_small (3+3 pre-norm
layers, 256 dims, 6.6 M parameters) pretrained from scratch with BART's denoising task
(\`configs/debdesc_pretrain.yaml\`: text infilling with Poisson(3.5) spans over 30% of the words, sentence
permutation, 48-position blocks) on the debdesc corpus' train descriptions only, then exported with
\`seqtrain-convert --to hf --dtype float16\`. \`dict.txt\` is the data-bin's dictionary (without \`<mask>\`), for
\`seqtrain-preprocess --srcdict\`; \`spm.model\` its sentencepiece model (\`--spm-model\`). Fine-tune it with
\`seqtrain-train ... --finetune-from-model $out\` (scripts/quickstart.sh does).
CARD
rm -rf "$out"
mv "$tmp/$(basename "$out")" "$out"
rmdir "$tmp"
ls -l "$out"
