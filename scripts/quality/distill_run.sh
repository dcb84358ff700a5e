#!/usr/bin/env bash
# Distillation on the bundled debdesc sample (issue 38 item 4; docs/quality.md, "Distillation"): does a student
# taught by a teacher beat the same student trained on the references alone? Three students, one recipe each, all
# the teacher with decoder layers $KEEP kept (DistilBART's shrink-and-fine-tune) and $UPDATES updates:
#   ref      label-smoothed cross-entropy on the references (the control)
#   word-kd  --criterion label_smoothed_cross_entropy_with_distillation (T 2, alpha 0.8) on the references
#   seq-kd   label-smoothed cross-entropy on the teacher's beam outputs for the training sources
# then beam search on valid (configs/debdesc_small.yaml's search) and ROUGE for the teacher and each student.
#
#   scripts/quickstart.sh && scripts/quality/distill_run.sh      # the quickstart's model is the teacher
#   TEACHER=ckpt.pt DATABIN=folder KEEP=0 UPDATES=300 OUT=logs/distill scripts/quality/distill_run.sh
#
# Rerunning reuses finished stages (a student with its checkpoint_best.pt, the teacher's train outputs); FRESH=1
# starts over. Figures: the ROUGE table this prints, also in $OUT/summary.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="${SEQTRAIN_VENV:-$root/.venv}/bin"
teacher="${TEACHER:-.quickstart/checkpoints/checkpoint_best.pt}"
databin="${DATABIN:-.quickstart/data-bin}"
pretrained="${PRETRAINED:-models/debdesc-small-denoising}"
sample="${SAMPLE:-data/debdesc-sample}"
keep="${KEEP:-0}"
updates="${UPDATES:-300}"
out="${OUT:-logs/distill}"
[ -f "$teacher" ] || { echo "distill_run.sh: error: TEACHER=$teacher not found (run scripts/quickstart.sh first)" >&2; exit 1; }
[ -f "$databin/dict.source.txt" ] || { echo "distill_run.sh: error: DATABIN=$databin has no dict.source.txt" >&2; exit 1; }
[ "${FRESH:-0}" = 1 ] && rm -rf "$out"
mkdir -p "$out"
stage() { echo; echo "==== [$(date +%H:%M:%S)] $*"; }
threads="$("$bin/python" -m seqtrain.host_cpu 2>/dev/null || echo 1)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"

valid_rouge() {  # $1 checkpoint, $2 name: beam search on valid, ROUGE json in $out/gen-$2
  [ -f "$out/gen-$2/rouge-valid.json" ] && return 0
  "$bin/seqtrain-generate" "$databin" --config configs/debdesc_small.yaml --path "$1" --gen-subset valid \
    --batch-size 64 --scoring rouge --quiet --results-path "$out/gen-$2" > "$out/generate-$2.txt"
}

stage "1/4 the teacher's valid ROUGE and its beam outputs for the ${teacher} training sources"
valid_rouge "$teacher" teacher
if [ ! -f "$out/teacher-train/hypotheses-train.txt" ]; then
  "$bin/seqtrain-generate" "$databin" --config configs/debdesc_small.yaml --path "$teacher" --gen-subset train \
    --batch-size 64 --quiet --results-path "$out/teacher-train" > "$out/generate-teacher-train.txt"
fi

stage "2/4 a data-bin whose training targets are the teacher's summaries (same tokenizer and dictionary)"
if [ ! -f "$out/data-bin-kd/dict.source.txt" ]; then
  rm -rf "$out/kd" "$out/data-bin-kd"
  mkdir -p "$out/kd"
  cp "$sample/train.source" "$out/kd/train.source"
  cp "$out/teacher-train/hypotheses-train.txt" "$out/kd/train.target"
  cp "$sample/valid.source" "$sample/valid.target" "$out/kd/"  # validation keeps the references
  "$bin/seqtrain-preprocess" --trainpref "$out/kd/train" --validpref "$out/kd/valid" --destdir "$out/data-bin-kd" \
    --joined-dictionary --spm-model "$pretrained/spm.model" --srcdict "$databin/dict.source.txt" --workers 2 \
    > "$out/preprocess-kd.txt"
fi

student() {  # $1 name, $2 data-bin, then extra seqtrain-train flags
  local name="$1" data="$2"
  shift 2
  if [ ! -f "$out/student-$name/checkpoint_best.pt" ]; then
    rm -rf "$out/student-$name"
    "$bin/seqtrain-train" "$data" --config configs/debdesc_small.yaml --save-dir "$out/student-$name" \
      --finetune-from-model "$teacher" --decoder-layers-to-keep "$keep" --max-update "$updates" --lr 0.0005 \
      --warmup-updates 60 --seed 1 --log-format simple --log-interval 50 --log-file "$out/train-$name.log" "$@" \
      > /dev/null
  fi
  valid_rouge "$out/student-$name/checkpoint_best.pt" "$name"
}

stage "3/4 three students, decoder layers $keep of the teacher's, $updates updates each"
student ref "$databin"
student word-kd "$databin" --criterion label_smoothed_cross_entropy_with_distillation --teacher-path "$teacher" \
  --distill-temperature 2 --distill-alpha 0.8
student seq-kd "$out/data-bin-kd"

stage "4/4 valid ROUGE, and each taught student against the control (paired bootstrap; ${out}/summary.json)"
for name in word-kd seq-kd; do
  "$bin/seqtrain-eval" --hyps "$out/gen-$name" --compare "$out/gen-ref" --source "$sample/valid.source" \
    --reference "$sample/valid.target" --bootstrap 1000 --json "$out/eval-$name.json" > /dev/null
done
"$bin/python" - "$out" "$keep" "$updates" <<'EOF'
import json, sys
out, keep, updates = sys.argv[1:]
rows = {}
for name in ("teacher", "ref", "word-kd", "seq-kd"):
    rows[name] = json.load(open(f"{out}/gen-{name}/rouge-valid.json", encoding="utf-8"))
print(f"{'valid (300), beam 4':<44}{'ROUGE-1':>9}{'ROUGE-2':>9}{'ROUGE-Lsum':>12}")
labels = {
    "teacher": "teacher (3+3 layers)",
    "ref": f"student, decoder {keep}: references",
    "word-kd": f"student, decoder {keep}: word-level KD",
    "seq-kd": f"student, decoder {keep}: teacher's outputs",
}
for name, s in rows.items():
    print(f"{labels[name]:<44}{s['rouge1']:>9.2f}{s['rouge2']:>9.2f}{s['rougeLsum']:>12.2f}")
tests = {}
print("\nagainst the student trained on references (delta, p of the paired bootstrap, 1,000 resamples):")
for name in ("word-kd", "seq-kd"):
    tests[name] = json.load(open(f"{out}/eval-{name}.json", encoding="utf-8"))["compare"]["test"]
    cells = "  ".join(f"{m} {t['delta']:+.2f} (p {t['p_value']:.3f})" for m, t in tests[name].items() if m != "rougeL")
    print(f"  {labels[name]}: {cells}")
summary = {"keep": keep, "updates": int(updates), "rouge": rows, "paired_test_vs_ref": tests}
with open(f"{out}/summary.json", "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
EOF
