"""ROUGE-1/2/L/Lsum with Google's `rouge-score` package (Porter stemming on), F1 x 100 averaged over examples.

ROUGE-Lsum is summary-level LCS over sentences, and rouge-score finds sentences by newlines. Hypotheses and
references are one line each, so sentences are split first with a simple rule, documented here because scores
depend on it: a sentence ends at '.', '!' or '?' (optionally followed by closing quotes or brackets) followed by
whitespace. (Abbreviations such as "e.g. x" split too; nltk's punkt would avoid that but needs a download.)
Newlines do not change ROUGE-1/2/L, whose tokenizer treats them as spaces.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from rouge_score import rouge_scorer

from seqtrain.errors import SeqtrainError, Stopped
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


# ROUGE-L's LCS table holds (hypothesis words + 1) x (reference words + 1) Python ints and fills them one by
# one: two lines of 4,096 words take about 8 s and 180 MB, two of 20,000 took 7.8 GB. Summaries are far shorter.
MAX_WORDS = 4096
_WORD = re.compile(r"[a-z0-9]+")  # rouge-score's tokens: runs of a-z0-9 of the lowercased text


def _words(text: str) -> int:
    return len(_WORD.findall(text.lower()))


def check_lengths(lines: Sequence[str], name: str, line_names: bool = True) -> None:
    """Refuse a line of more than MAX_WORDS words (rouge-score's tokens), before anything is scored:
    `name`:LINE (a file) or `name` LINE (hypothesis 3) in the one-line error."""
    for i, line in enumerate(lines, 1):
        if len(line) > MAX_WORDS:  # fewer characters than that cannot hold MAX_WORDS + 1 words
            n = _words(line)
            if n > MAX_WORDS:
                where = f"{name}:{i}" if line_names else f"{name} {i}"
                raise SeqtrainError(
                    f"{where}: {n} words, more than the {MAX_WORDS} ROUGE scores per line (ROUGE-L's time and "
                    "memory grow with the product of the two lines' lengths); shorten or split the line"
                )


def score_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 x 100 of each ROUGE type over aligned (hypothesis, reference) pairs; also "n" = pair count.
    A line of more than MAX_WORDS words is refused before any is scored."""
    if len(hypotheses) != len(references):
        raise SeqtrainError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise SeqtrainError("nothing to score: no hypotheses")
    check_lengths(hypotheses, "hypothesis", line_names=False)
    check_lengths(references, "reference", line_names=False)
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
    check_lengths(hyps, sys_path)
    check_lengths(refs, ref_path)
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


__all__ = [
    "MAX_WORDS",
    "ROUGE_TYPES",
    "check_lengths",
    "split_sentences",
    "score_pairs",
    "score_files",
    "format_summary",
    "write_json",
]


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(signum, f"stopped by {signal.Signals(signum).name}; nothing was written")


@contextlib.contextmanager
def _stoppable() -> Iterator[None]:
    """SIGTERM ends scoring at once with one line and 143, as Ctrl-C does with `interrupted` and 130 (SIGTERM's
    default action ended the process without a word, a scheduler's SIGTERM meeting it deep in a long LCS
    table). Outside the main thread (a library caller's worker) signals cannot be handled: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def score(args: Any) -> dict[str, float]:
    """seqtrain-score: print ROUGE of --sys against --ref (and write --json); returns the scores. SIGTERM while
    scoring: seqtrain.errors.Stopped (143), nothing written."""
    with _stoppable():
        scores = score_files(args.sys, args.ref)
    print(format_summary(scores))
    if args.json:
        write_json(scores, args.json, sys=args.sys, ref=args.ref)
    return scores
