"""Monolingual pretraining text from the debdesc train descriptions, for `seqtrain-preprocess --only-source`.

Each description is cut into sentences, and a sentence longer than --max-words words into pieces of at most
that many, one per line: `--task denoising --sample-break-mode complete` then packs whole lines into blocks of
--tokens-per-sample positions, and a line never outgrows a block. Only the train split's *descriptions* are read
(never the synopses, never valid or test); its last --held-out descriptions become the pretraining valid split.

    python scripts/quality/pretrain_text.py ../shared/data/debdesc/train.source data-bin/debdesc-mono.raw
"""

from __future__ import annotations

import argparse
import os
import re

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")


def lines_of(description: str, max_words: int) -> list[str]:
    """The description's sentences, each cut into runs of at most `max_words` words."""
    out = []
    for sentence in SENTENCE_END.split(description.strip()):
        words = sentence.split()
        out.extend(" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="train.source of the corpus (one description per line)")
    p.add_argument("outdir", help="writes OUTDIR/train and OUTDIR/valid (one sentence per line)")
    p.add_argument("--max-words", type=int, default=20, help="longest line in words (default: 20)")
    p.add_argument("--held-out", type=int, default=500, help="descriptions kept for valid (default: 500)")
    a = p.parse_args()
    with open(a.source, encoding="utf-8") as f:
        descriptions = f.read().split("\n")[:-1]
    os.makedirs(a.outdir, exist_ok=True)
    cut = len(descriptions) - a.held_out
    for split, part in (("train", descriptions[:cut]), ("valid", descriptions[cut:])):
        tmp = os.path.join(a.outdir, f".{split}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for d in part:
                f.writelines(line + "\n" for line in lines_of(d, a.max_words))
        os.replace(tmp, os.path.join(a.outdir, split))
        print(f"{split}: {len(part)} descriptions")


if __name__ == "__main__":
    main()
