#!/usr/bin/env python
"""How much does a trained model use its source? Valid nll with the true sources against the same targets
scored with the sources rotated by one example within each batch (every target paired with another package's
description). A model that ignores the source scores both alike; the gap, in bits per target token, is the
information it draws from the source.

    .venv/bin/python scripts/quality/source_dependence.py checkpoints/quality/checkpoint_best.pt data-bin/debdesc \
        --subset valid1 --max-source-positions 64
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from seqtrain.data.indexed_dataset import MMapIndexedDataset  # noqa: E402
from seqtrain.data.pair_dataset import LanguagePairDataset  # noqa: E402
from seqtrain.errors import SeqtrainError  # noqa: E402


def source_dependence(
    model: torch.nn.Module,
    dataset: LanguagePairDataset,
    batch_size: int = 50,
    pad: int = 1,
    limit: int | None = None,
) -> dict[str, float]:
    """{"real": nll, "shuffled": nll, "gap": shuffled - real} in bits per target token (no label smoothing), over
    the first `limit` examples (all by default)."""
    n_examples = len(dataset) if limit is None else min(limit, len(dataset))
    model.eval()
    total = {"real": 0.0, "shuffled": 0.0}
    ntokens = 0
    with torch.no_grad():
        for start in range(0, n_examples, batch_size):
            sample = dataset.collater([dataset[i] for i in range(start, min(start + batch_size, n_examples))])
            net, target = sample["net_input"], sample["target"]
            n = target.size(0)
            for name, order in (("real", torch.arange(n)), ("shuffled", torch.roll(torch.arange(n), 1))):
                logits = model(
                    net["src_tokens"][order], net["src_lengths"][order], net["prev_output_tokens"]
                )[0]
                lprobs = F.log_softmax(logits.float(), dim=-1)
                total[name] += F.nll_loss(
                    lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=pad, reduction="sum"
                ).item()
            ntokens += int(target.ne(pad).sum())
    out = {k: v / ntokens / math.log(2) for k, v in total.items()}
    out["gap"] = out["shuffled"] - out["real"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("data", help="the data-bin the model was trained on")
    p.add_argument("--subset", default="valid")
    p.add_argument(
        "--max-source-positions",
        type=int,
        default=None,
        help="truncate sources as training did (default: the model's limit)",
    )
    p.add_argument("--limit", type=int, default=None, help="score the first N examples only")
    args = p.parse_args(argv)
    from seqtrain.checkpoint.load import load_model

    try:
        lm = load_model(args.checkpoint)
        prefix = os.path.join(args.data, f"{args.subset}.source-target.")
        if not os.path.exists(prefix + "source.idx"):
            raise SeqtrainError(f"{prefix}source.idx: no such split in {args.data}")
        src, tgt = MMapIndexedDataset(prefix + "source"), MMapIndexedDataset(prefix + "target")
        max_src, max_tgt = lm.model.max_positions()
        dataset = LanguagePairDataset(
            src,
            src.sizes,
            lm.src_dict,
            tgt,
            tgt.sizes,
            lm.tgt_dict,
            truncate_source=True,
            max_source_positions=args.max_source_positions or max_src,
            max_target_positions=max_tgt,
        )
        r = source_dependence(lm.model, dataset, limit=args.limit)
    except SeqtrainError as e:
        print(f"source_dependence.py: error: {e}", file=sys.stderr)
        return 1
    print(
        f"{args.subset}: nll {r['real']:.3f} bits/token with the true sources, {r['shuffled']:.3f} with "
        f"sources rotated across examples: the source is worth {r['gap']:.3f} bits per target token"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
