#!/usr/bin/env python3
"""Rebuild the bundled debdesc sample (data/debdesc-sample) from ../shared/data/debdesc.

train: 5,000 examples drawn (seed 0) from the corpus' train split;
valid and test: two disjoint sets of 300 drawn (seed 1) from the corpus' valid split.
Line order within each split follows the corpus. Deterministic: reruns give identical files.
"""

import argparse
import os
import random


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--corpus", default=os.path.join(here, "..", "..", "..", "shared", "data", "debdesc"))
    p.add_argument("--out", default=os.path.join(here, "..", "..", "data", "debdesc-sample"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    src = {s: read_lines(os.path.join(a.corpus, f"{s}.source")) for s in ("train", "valid")}
    tgt = {s: read_lines(os.path.join(a.corpus, f"{s}.target")) for s in ("train", "valid")}
    train_idx = sorted(random.Random(0).sample(range(len(src["train"])), 5000))
    valid_perm = list(range(len(src["valid"])))
    random.Random(1).shuffle(valid_perm)
    picks = {
        "train": ("train", train_idx),
        "valid": ("valid", sorted(valid_perm[:300])),
        "test": ("valid", sorted(valid_perm[300:600])),
    }
    for split, (origin, idx) in picks.items():
        for side, lines in (("source", src[origin]), ("target", tgt[origin])):
            with open(os.path.join(a.out, f"{split}.{side}"), "w", encoding="utf-8") as f:
                f.writelines(lines[i] + "\n" for i in idx)
        print(f"{split}: {len(idx)} examples from corpus {origin}")


if __name__ == "__main__":
    main()
