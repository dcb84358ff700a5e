#!/usr/bin/env bash
# Make docs/img/seqtrain_eval.png, the README's picture of a seqtrain-eval page: the lead baseline (the first
# sentence cut to 12 words, scripts/quality/lead_baseline.py) on the debdesc sample's valid split, compared with
# the first 8 words of the sources, rendered by headless chromium (apt-get install chromium).
#   scripts/dev/eval_screenshot.sh [OUT.png]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$(realpath -m "${1:-$root/docs/img/seqtrain_eval.png}")"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$browser" ] || { echo "eval_screenshot.sh: error: no chromium (apt-get install chromium)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sample="$root/data/debdesc-sample"
python "$root/scripts/quality/lead_baseline.py" "$sample/valid" --hypotheses "$tmp/lead-12-words.txt" > /dev/null
cut -d' ' -f1-8 "$sample/valid.source" > "$tmp/first-8-words.txt"
mkdir "$tmp/data"
ln -s "$sample" "$tmp/data/debdesc-sample"
cd "$tmp"  # the page names its files as given: short relative paths
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python -m seqtrain_cli.eval --hyps lead-12-words.txt \
  --compare first-8-words.txt --source data/debdesc-sample/valid.source \
  --reference data/debdesc-sample/valid.target --train-source data/debdesc-sample/train.source \
  --source-limit 40 --title "lead baseline (first sentence, 12 words) on the debdesc sample's valid split" \
  --html page.html > /dev/null
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/profile" \
  --window-size=960,1080 --screenshot="$out" "file://$tmp/page.html" 2> /dev/null
echo "wrote $out"
