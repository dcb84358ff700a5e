"""ROUGE-1/2/L/Lsum with Google's `rouge-score` package (Porter stemming on), F1 x 100 averaged over examples.

ROUGE-Lsum is summary-level LCS over sentences, and rouge-score finds sentences by newlines. Hypotheses and
references are one line each, so sentences are split first with a simple rule, documented here because scores
depend on it: a sentence ends at '.', '!' or '?' (optionally followed by closing quotes or brackets) followed by
whitespace. (Abbreviations such as "e.g. x" split too; nltk's punkt would avoid that but needs a download.)
Newlines do not change ROUGE-1/2/L, whose tokenizer treats them as spaces.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from seqtrain.errors import SeqtrainError, stop_on_sigterm
from seqtrain.fileio import atomic_write, check_outputs_apart, text_lines
from seqtrain.scoring.settings import ScoreConfig

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


def rouge_scorer() -> Any:
    """rouge-score's rouge_scorer module, imported here (not at the top: it loads nltk, ~0.4 s of every program's
    start), with its absl logger held to warnings: every scorer it builds logged `INFO | absl | Using default
    tokenizer.` into each generate, tune and eval run. Every user of rouge-score imports it through this."""
    logging.getLogger("absl").setLevel(logging.WARNING)
    from rouge_score import rouge_scorer as module  # here: it loads nltk, which only scoring needs

    return module


def example_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, list[float]]:
    """F1 x 100 of each ROUGE type for each aligned (hypothesis, reference) pair, in order. A line of more than
    MAX_WORDS words is refused before any is scored."""
    if len(hypotheses) != len(references):
        raise SeqtrainError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise SeqtrainError("nothing to score: no hypotheses")
    check_lengths(hypotheses, "hypothesis", line_names=False)
    check_lengths(references, "reference", line_names=False)
    scorer = rouge_scorer().RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    out: dict[str, list[float]] = {key: [] for key in ROUGE_TYPES}
    for hyp, ref in zip(hypotheses, references):
        scores = scorer.score(_prepare(ref), _prepare(hyp))  # rouge-score's order: (target, prediction)
        for key in ROUGE_TYPES:
            out[key].append(100.0 * scores[key].fmeasure)
    return out


def mean_scores(per: dict[str, list[float]]) -> dict[str, float]:
    """The mean of each ROUGE type over `per` (example_scores' lists), and "n" = the example count."""
    n = len(per[ROUGE_TYPES[0]])
    out: dict[str, float] = {key: sum(per[key]) / n for key in ROUGE_TYPES}
    out["n"] = n
    return out


def score_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F1 x 100 of each ROUGE type over aligned (hypothesis, reference) pairs; also "n" = pair count.
    A line of more than MAX_WORDS words is refused before any is scored."""
    return mean_scores(example_scores(hypotheses, references))


def _read_lines(path: str) -> list[str]:
    """One example per line (a final newline does not start an extra one; a "\\r" before it is dropped), read
    with seqtrain.fileio's bound on a line's length and strict UTF-8, errors naming the file and line."""
    try:
        with open(path, "rb") as f:
            return [line.removesuffix("\r") for line in text_lines(f, path)]
    except OSError as e:
        raise SeqtrainError(f"cannot read {path}: {e.strerror}") from None


def check_some_text(lines: Sequence[str], path: str, what: str) -> None:
    """Refuse `lines` that are all empty (or only whitespace): every score against them would be 0, and such
    a file is another file than meant (a column cut wrong, a failed export); `what`: "references", ..."""
    if lines and not any(line.strip() for line in lines):
        raise SeqtrainError(f"{path}: all {len(lines)} {what} are empty lines; nothing to score against")


def _read_pair(sys_path: str, ref_path: str) -> tuple[list[str], list[str]]:
    hyps, refs = _read_lines(sys_path), _read_lines(ref_path)
    if len(hyps) != len(refs):
        raise SeqtrainError(
            f"line counts differ: {sys_path} has {len(hyps)} lines, {ref_path} has {len(refs)}"
        )
    if not hyps:
        raise SeqtrainError(f"nothing to score: {sys_path} is empty")
    check_some_text(refs, ref_path, "references")
    check_lengths(hyps, sys_path)
    check_lengths(refs, ref_path)
    return hyps, refs


def score_files(sys_path: str, ref_path: str) -> dict[str, float]:
    """Score a hypothesis file against a reference file, line by line."""
    return score_pairs(*_read_pair(sys_path, ref_path))


# Bootstrap resampling over examples (Efron's percentile bootstrap; Koehn 2004's paired test). Every resample
# draws n example indices with replacement from numpy's default_rng(seed), so a seed gives the same figures.
CONFIDENCE = 0.95


def _resamples(n: int, n_resamples: int, seed: int) -> Iterator[Any]:
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        yield rng.integers(0, n, size=n)


def bootstrap_intervals(
    per: dict[str, list[float]], n_resamples: int, seed: int = 1
) -> dict[str, tuple[float, float]]:
    """95% percentile-bootstrap interval of each ROUGE mean: the 2.5th and 97.5th percentiles (numpy's linear
    interpolation) of the means of `n_resamples` resamples of the examples, drawn with replacement."""
    if n_resamples < 1:
        raise SeqtrainError(f"--bootstrap {n_resamples}: needs at least 1 resample")
    table = np.array([per[key] for key in ROUGE_TYPES], dtype=np.float64)  # types x examples
    means = np.array([table[:, idx].mean(axis=1) for idx in _resamples(table.shape[1], n_resamples, seed)])
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail], axis=0)
    return {key: (float(lo[i]), float(hi[i])) for i, key in enumerate(ROUGE_TYPES)}


def paired_bootstrap(
    per_a: dict[str, list[float]], per_b: dict[str, list[float]], n_resamples: int, seed: int = 1
) -> dict[str, dict[str, float]]:
    """Paired bootstrap test of system A against system B on the same references (Koehn 2004): each resample
    draws the same example indices for both systems. Per ROUGE type: delta (A's mean - B's, on all examples),
    a_wins (the fraction of resamples where A's mean is above B's), ties (equal), and the two-sided p-value
    2 * min(fraction delta* <= 0, fraction delta* >= 0), at most 1 (identical systems: p = 1; A above B in
    every resample: p = 0, that is below 1 / n_resamples)."""
    if n_resamples < 1:
        raise SeqtrainError(f"--bootstrap {n_resamples}: needs at least 1 resample")
    a = np.array([per_a[key] for key in ROUGE_TYPES], dtype=np.float64)
    b = np.array([per_b[key] for key in ROUGE_TYPES], dtype=np.float64)
    if a.shape != b.shape:
        raise SeqtrainError(f"{a.shape[1]} examples in system A but {b.shape[1]} in system B")
    diff = a - b
    deltas = np.array([diff[:, idx].mean(axis=1) for idx in _resamples(diff.shape[1], n_resamples, seed)])
    # differences of a few ulps are rounding, not a win: identical per-example scores give exactly 0 here
    wins = (deltas > 0).mean(axis=0)
    ties = (deltas == 0).mean(axis=0)
    losses = (deltas < 0).mean(axis=0)
    out: dict[str, dict[str, float]] = {}
    for i, key in enumerate(ROUGE_TYPES):
        p = min(1.0, 2.0 * min(wins[i] + ties[i], losses[i] + ties[i]))
        out[key] = {
            "delta": float(diff[i].mean()),
            "a_wins": float(wins[i]),
            "ties": float(ties[i]),
            "p_value": float(p),
        }
    return out


def format_summary(scores: dict[str, float]) -> str:
    """One line, e.g. 'ROUGE-1 44.12 | ROUGE-2 21.30 | ROUGE-L 30.92 | ROUGE-Lsum 41.07 | n 300'."""
    parts = [f"{_LABELS[k]} {scores[k]:.2f}" for k in ROUGE_TYPES if k in scores]
    if "n" in scores:
        parts.append(f"n {int(scores['n'])}")
    return " | ".join(parts)


def format_intervals(intervals: dict[str, tuple[float, float]], n_resamples: int, seed: int) -> str:
    """One line, e.g. '95% CI (bootstrap 1000, seed 1): ROUGE-1 43.10-45.02 | ROUGE-2 ...'."""
    parts = [f"{_LABELS[k]} {lo:.2f}-{hi:.2f}" for k, (lo, hi) in intervals.items()]
    return f"{100 * CONFIDENCE:.0f}% CI (bootstrap {n_resamples}, seed {seed}): " + " | ".join(parts)


def format_comparison(test: dict[str, dict[str, float]], other: str, n_resamples: int, seed: int) -> str:
    """One line per ROUGE type: A - B, the fraction of resamples A wins, the two-sided p-value."""
    lines = [f"paired bootstrap against {other} ({n_resamples} resamples, seed {seed}):"]
    for k, t in test.items():
        lines.append(
            f"  {_LABELS[k]}: A-B {t['delta']:+.2f} | A better in {t['a_wins']:.3f} of resamples | "
            f"p {t['p_value']:.4f}"
        )
    return "\n".join(lines)


def write_json(scores: dict[str, Any], path: str, **extra: object) -> None:
    """Write the scores (plus any extra fields, e.g. file names) as JSON, atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump({**extra, **scores}, f, indent=2, sort_keys=True)
        f.write("\n")


__all__ = [
    "MAX_WORDS",
    "ROUGE_TYPES",
    "CONFIDENCE",
    "bootstrap_intervals",
    "check_lengths",
    "check_some_text",
    "rouge_scorer",
    "example_scores",
    "format_comparison",
    "format_intervals",
    "mean_scores",
    "paired_bootstrap",
    "split_sentences",
    "score_pairs",
    "score_files",
    "format_summary",
    "write_json",
]


def score(cfg: ScoreConfig) -> dict[str, Any]:
    """seqtrain-score: print ROUGE of --sys against --ref (and write --json); with --bootstrap N the 95%
    intervals, with --compare OTHER the paired bootstrap test of --sys against OTHER; returns what --json
    holds. SIGTERM while scoring: seqtrain.errors.Stopped (143), nothing written."""
    n_boot = cfg.bootstrap or 0
    other = cfg.compare
    seed = cfg.seed
    if other and not n_boot:
        n_boot = 1000
    check_outputs_apart(
        [("--json", cfg.json)], [("--sys", cfg.sys), ("--ref", cfg.ref), ("--compare", other)]
    )
    with stop_on_sigterm():
        hyps, refs = _read_pair(cfg.sys, cfg.ref)
        per = example_scores(hyps, refs)
        out: dict[str, Any] = mean_scores(per)
        if n_boot:
            intervals = bootstrap_intervals(per, n_boot, seed)
            out.update(bootstrap=n_boot, seed=seed, ci={k: list(v) for k, v in intervals.items()})
        if other:
            hyps_b, _ = _read_pair(other, cfg.ref)
            per_b = example_scores(hyps_b, refs)
            test = paired_bootstrap(per, per_b, n_boot, seed)
            out["compare"] = {"sys": other, "scores": mean_scores(per_b), "test": test}
    print(format_summary(out))
    if n_boot:
        print(format_intervals(intervals, n_boot, seed))
    if other:
        print(f"{other}: {format_summary(out['compare']['scores'])}")
        print(format_comparison(test, other, n_boot, seed))
    if cfg.json:
        write_json(out, cfg.json, sys=cfg.sys, ref=cfg.ref)
    return out
