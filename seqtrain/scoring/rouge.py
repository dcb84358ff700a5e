"""ROUGE-1/2/L/Lsum with Google's `rouge-score` package (Porter stemming on), F1 x 100 averaged over examples.

ROUGE-Lsum is summary-level LCS over sentences, and rouge-score finds sentences by newlines. Hypotheses and
references are one line each, so sentences are split first with a simple rule, documented here because scores
depend on it: a sentence ends at '.', '!' or '?' (optionally followed by closing quotes or brackets) followed by
whitespace. (Abbreviations such as "e.g. x" split too; nltk's punkt would avoid that but needs a download.)
Newlines do not change ROUGE-1/2/L, whose tokenizer treats them as spaces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from rouge_score import rouge_scorer

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_LABELS = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def split_sentences(text: str) -> list[str]:
    """Split at '.', '!', '?' (plus closing quotes/brackets) followed by whitespace; drops empty pieces."""
    pieces: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        # keep closing quotes/brackets with the sentence they close
        end = m.start() + len(m.group(0).rstrip())
        pieces.append(text[start:end])
        start = m.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]


def _prepare(text: str) -> str:
    return "\n".join(split_sentences(text))


def score_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 x 100 of each ROUGE type over aligned (hypothesis, reference) pairs; also "n" = pair count."""
    if len(hypotheses) != len(references):
        raise SeqtrainError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise SeqtrainError("nothing to score: no hypotheses")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hyp, ref in zip(hypotheses, references):
        scores = scorer.score(_prepare(ref), _prepare(hyp))  # rouge-score's order: (target, prediction)
        for key in ROUGE_TYPES:
            totals[key] += scores[key].fmeasure
    n = len(hypotheses)
    out: dict[str, float] = {key: 100.0 * totals[key] / n for key in ROUGE_TYPES}
    out["n"] = n
    return out


def _read_lines(path: str) -> list[str]:
    """One example per line; a final newline does not start an extra (empty) example."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SeqtrainError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise SeqtrainError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if text.endswith("\n"):
        text = text[:-1]
    return [line.rstrip("\r") for line in text.split("\n")] if text else []


def score_files(sys_path: str, ref_path: str) -> dict[str, float]:
    """Score a hypothesis file against a reference file, line by line."""
    hyps, refs = _read_lines(sys_path), _read_lines(ref_path)
    if len(hyps) != len(refs):
        raise SeqtrainError(
            f"line counts differ: {sys_path} has {len(hyps)} lines, {ref_path} has {len(refs)}"
        )
    if not hyps:
        raise SeqtrainError(f"nothing to score: {sys_path} is empty")
    return score_pairs(hyps, refs)


def format_summary(scores: dict[str, float]) -> str:
    """One line, e.g. 'ROUGE-1 44.12 | ROUGE-2 21.30 | ROUGE-L 30.92 | ROUGE-Lsum 41.07 | n 300'."""
    parts = [f"{_LABELS[k]} {scores[k]:.2f}" for k in ROUGE_TYPES if k in scores]
    if "n" in scores:
        parts.append(f"n {int(scores['n'])}")
    return " | ".join(parts)


def write_json(scores: dict[str, float], path: str, **extra: object) -> None:
    """Write the scores (plus any extra fields, e.g. file names) as JSON, atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump({**extra, **scores}, f, indent=2, sort_keys=True)
        f.write("\n")


__all__ = ["ROUGE_TYPES", "split_sentences", "score_pairs", "score_files", "format_summary", "write_json"]


def score(args: Any) -> dict[str, float]:
    """seqtrain-score: print ROUGE of --sys against --ref (and write --json); returns the scores."""
    scores = score_files(args.sys, args.ref)
    print(format_summary(scores))
    if args.json:
        write_json(scores, args.json, sys=args.sys, ref=args.ref)
    return scores
