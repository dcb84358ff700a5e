#!/usr/bin/env python
"""The lead baseline of the debdesc corpus README (`lead1_12w`): the source's first sentence (text up to the
first '. ') cut to 12 words, scored with seqtrain.scoring.rouge against the targets.

    python scripts/quality/lead_baseline.py data/debdesc-sample/test            # reads test.source / test.target
    python scripts/quality/lead_baseline.py ../shared/data/debdesc/valid --hypotheses lead.txt

On the full debdesc valid split it gives the README's figures (ROUGE-1/2/Lsum 35.16 / 17.02 / 30.83).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from seqtrain.errors import SeqtrainError  # noqa: E402
from seqtrain.scoring.rouge import _read_lines, format_summary, score_pairs  # noqa: E402


def lead(source: str, words: int = 12) -> str:
    return " ".join(source.split(". ")[0].split()[:words])


def main(argv: list[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prefix", help="PREFIX.source and PREFIX.target (one example per line)")
    p.add_argument("--words", type=int, default=12, help="words kept from the first sentence (default: 12)")
    p.add_argument("--hypotheses", help="also write the baseline summaries here")
    p.add_argument("--json", help="write the scores here as JSON")
    args = p.parse_args(argv)
    try:
        sources = _read_lines(args.prefix + ".source")
        targets = _read_lines(args.prefix + ".target")
        if len(sources) != len(targets):
            raise SeqtrainError(
                f"{args.prefix}.source has {len(sources)} lines, {args.prefix}.target {len(targets)}"
            )
        hyps = [lead(s, args.words) for s in sources]
        scores = score_pairs(hyps, targets)
    except SeqtrainError as e:
        print(f"lead_baseline.py: error: {e}", file=sys.stderr)
        return 1
    if args.hypotheses:
        with open(args.hypotheses, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}, f, indent=1)
    print(f"lead baseline (first sentence, {args.words} words): {format_summary(scores)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
