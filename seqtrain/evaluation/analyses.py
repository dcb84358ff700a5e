"""The figures of a seqtrain-eval report that are not ROUGE itself, each a small function of the texts so it can be
checked by hand: baselines (lead-k, the greedy extractive oracle), length statistics and source-length buckets,
the faithfulness proxy, the share of each reference past the source truncation limit, near-duplicate sources
between train and the evaluated split, and the validation curves of a training log.

Words are rouge-score's tokens (the lowercased text's runs of a-z0-9), so lengths, limits and overlaps count what
ROUGE counts; the oracle's selection uses rouge-score's own n-gram F1 on its stemmed tokens.
"""

from __future__ import annotations

import bisect
import collections
import functools
import math
import re
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import bounded_lines, loads_bounded
from seqtrain.scoring.rouge import rouge_scorer, split_sentences

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """rouge-score's tokens without stemming: the lowercased text's runs of a-z0-9."""
    return _WORD.findall(text.lower())


# ---------------------------------------------------------------------------------------------------------------
# baselines


def lead(source: str, k: int) -> str:
    """The first k sentences of the source (seqtrain.scoring.rouge.split_sentences' rule)."""
    return " ".join(split_sentences(source)[:k])


def _ngrams(tokens: Sequence[str], n: int) -> collections.Counter:
    return collections.Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def ngram_f1(target: collections.Counter, prediction: collections.Counter) -> float:
    """rouge-score's n-gram F1 (rouge_scorer._score_ngrams) of two n-gram Counters."""
    overlap = sum(min(c, prediction[g]) for g, c in target.items())
    p = overlap / max(sum(prediction.values()), 1)
    r = overlap / max(sum(target.values()), 1)
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


@functools.cache
def _stemmed() -> Any:
    """rouge-score's stemming tokenizer, loaded on first use (it loads nltk: not at every program's start)."""
    rouge_scorer()  # rouge-score imported as seqtrain.scoring.rouge does (its absl logger quiet)
    from rouge_score import tokenizers  # here, not at the top: it loads nltk (the GPU image has none)

    return tokenizers.DefaultTokenizer(use_stemmer=True)


ORACLE_MAX_SENTENCES = 5


def oracle(source: str, reference: str, max_sentences: int = ORACLE_MAX_SENTENCES) -> tuple[str, list[int]]:
    """The greedy extractive oracle (Nallapati et al. 2017, as BertSum labels its data): starting from nothing,
    add the source sentence that most raises ROUGE-1 F1 + ROUGE-2 F1 (rouge-score's, stemmed) of the selection
    against the reference, until no sentence raises it or `max_sentences` are chosen. Returns the chosen
    sentences in source order, joined, and their indices."""
    sentences = split_sentences(source)
    stem = _stemmed()
    tokens = [stem.tokenize(s) for s in sentences]
    ref = stem.tokenize(reference)
    ref1, ref2 = _ngrams(ref, 1), _ngrams(ref, 2)
    chosen: list[int] = []
    best = 0.0
    while len(chosen) < max_sentences:
        pick, pick_score = None, best
        for i in range(len(sentences)):
            if i in chosen:
                continue
            sel = [t for j in sorted(chosen + [i]) for t in tokens[j]]
            score = ngram_f1(ref1, _ngrams(sel, 1)) + ngram_f1(ref2, _ngrams(sel, 2))
            if score > pick_score:  # ties keep the earlier sentence
                pick, pick_score = i, score
        if pick is None:
            break
        chosen.append(pick)
        best = pick_score
    chosen.sort()
    return " ".join(sentences[i] for i in chosen), chosen


# ---------------------------------------------------------------------------------------------------------------
# lengths and buckets


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    a = np.asarray(lengths, dtype=np.float64)
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "min": int(a.min()),
        "max": int(a.max()),
    }


def bucket_edges(lengths: Sequence[int], n_buckets: int) -> list[int]:
    """Upper edges of the first n_buckets - 1 source-length buckets: the lengths at the 1/n, 2/n, ... quantiles
    (numpy's 'lower' method: always a length that occurs), duplicates dropped. Bucket k holds the examples
    with edges[k-1] < length <= edges[k] (the last: longer than the last edge)."""
    qs = [100.0 * i / n_buckets for i in range(1, n_buckets)]
    edges = sorted({int(v) for v in np.percentile(np.asarray(lengths), qs, method="lower")}) if qs else []
    return [e for e in edges if e < max(lengths)]


def bucket_of(length: int, edges: Sequence[int]) -> int:
    return bisect.bisect_left(edges, length)


def bucket_labels(edges: Sequence[int], lengths: Sequence[int]) -> list[str]:
    lo = [min(lengths)] + [e + 1 for e in edges]
    hi = list(edges) + [max(lengths)]
    return [f"{a}-{b}" if a != b else f"{a}" for a, b in zip(lo, hi)]


# ---------------------------------------------------------------------------------------------------------------
# faithfulness proxy

_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,:/]\d+)*(?![\w])")
_NAME = re.compile(r"[A-Z][A-Za-z0-9&'+-]*")


def _numbers(text: str) -> list[str]:
    return [m.group(0).replace(",", "") for m in _NUMBER.finditer(text)]


def _names(text: str) -> list[str]:
    """Capitalised words that do not start a sentence (a sentence's first word is capitalised anyway)."""
    out = []
    for sentence in split_sentences(text):
        for k, m in enumerate(re.finditer(r"\S+", sentence)):
            word = m.group(0).strip("\"'()[]{}.,;:!?")
            if k and _NAME.fullmatch(word) and any(c.isalpha() for c in word):
                out.append(word)
    return out


def unsupported(summary: str, source: str) -> dict[str, Any]:
    """The faithfulness proxy of one summary: its numbers (commas dropped: 1,000 = 1000) and capitalised names
    (not sentence-initial) that the source does not contain (numbers: as numbers of the source; names: as a
    word of the source, any case). {"items": how many were checked, "absent": [those missing]}."""
    src_numbers = set(_numbers(source))
    src_words = set(words(source))
    items = [("number", x) for x in _numbers(summary)] + [("name", x) for x in _names(summary)]
    absent = []
    for kind, x in items:
        if kind == "number":
            missing = x not in src_numbers
        else:
            missing = any(w not in src_words for w in words(x)) or not words(x)
        if missing:
            absent.append(x)
    return {"items": len(items), "absent": absent}


def faithfulness_summary(per: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Overall: absent items / checked items (micro), and the share of examples with at least one absent."""
    items = sum(p["items"] for p in per)
    absent = sum(len(p["absent"]) for p in per)
    return {
        "items": items,
        "absent": absent,
        "absent_share": absent / items if items else 0.0,
        "examples_with_absent": sum(1 for p in per if p["absent"]),
        "examples_with_absent_share": sum(1 for p in per if p["absent"]) / len(per),
    }


# ---------------------------------------------------------------------------------------------------------------
# source truncation


def past_limit(source: str, reference: str, limit: int) -> float:
    """The share of the reference's words that the source holds only past its first `limit` words: what a model
    reading the truncated source cannot copy (words the source lacks entirely do not count as past the limit)."""
    src = words(source)
    ref = words(reference)
    if not ref:
        return 0.0
    kept, cut = set(src[:limit]), set(src[limit:])
    return sum(1 for w in ref if w in cut and w not in kept) / len(ref)


def kept_words(source: str, fits: Callable[[str], bool]) -> int:
    """How many of the source's words (rouge-score's tokens, as past_limit counts them) a model that reads only a
    prefix keeps: the words of the longest whitespace-separated prefix that `fits` (the model's tokenizer within
    its position limit). Binary search: a few tokenizer calls per source, none for a source that fits whole."""
    if fits(source):
        return len(words(source))
    parts = source.split()
    lo, hi = 0, len(parts)  # fits(first lo parts); not fits(first hi parts)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(" ".join(parts[:mid])):
            lo = mid
        else:
            hi = mid
    return len(words(" ".join(parts[:lo])))


# ---------------------------------------------------------------------------------------------------------------
# near-duplicates between train and the evaluated split

SHINGLE = 5
_INDEX_ENTRIES = 5_000_000  # above this many train shingles, only every k-th (by a stable hash) is indexed


def _shingles(tokens: Sequence[str]) -> set[str]:
    if len(tokens) < SHINGLE:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i : i + SHINGLE]) for i in range(len(tokens) - SHINGLE + 1)}


def _stable(shingle: str) -> int:
    return zlib.crc32(shingle.encode("utf-8"))  # Python's hash() is salted per process


def duplicates(train: Sequence[str], sources: Sequence[str], threshold: float) -> dict[str, Any]:
    """Sources of the evaluated split that train holds: exact (the same words) and high-overlap (at least
    `threshold` of the source's word 5-grams are in one train source). Candidates come from an index of the
    train 5-grams (a sample of them, by a stable hash, when there are more than _INDEX_ENTRIES); each candidate's
    overlap is then computed exactly. Returns counts and the example ids (from 0)."""
    exact_keys: dict[str, int] = {}
    total = 0
    train_tokens = []
    for i, text in enumerate(train):
        toks = words(text)
        train_tokens.append(len(toks))
        exact_keys.setdefault(" ".join(toks), i)
        total += max(len(toks) - SHINGLE + 1, 1)
    every = max(1, -(-total // _INDEX_ENTRIES))
    index: dict[str, list[int]] = collections.defaultdict(list)
    for i, text in enumerate(train):
        for s in _shingles(words(text)):
            if every == 1 or _stable(s) % every == 0:
                index[s].append(i)
    exact, high, overlaps = [], [], []
    for k, text in enumerate(sources):
        toks = words(text)
        if " ".join(toks) in exact_keys:
            exact.append(k)
            high.append(k)
            overlaps.append(1.0)
            continue
        mine = _shingles(toks)
        counts: collections.Counter = collections.Counter()
        for s in mine:
            if every == 1 or _stable(s) % every == 0:
                counts.update(index.get(s, ()))
        best = 0.0
        for i, _ in counts.most_common(5):
            best = max(best, len(mine & _shingles(words(train[i]))) / len(mine))
        overlaps.append(best)
        if mine and best >= threshold:
            high.append(k)
    return {
        "train_examples": len(train),
        "threshold": threshold,
        "exact": len(exact),
        "high_overlap": len(high),
        "exact_ids": exact,
        "high_overlap_ids": high,
        "index_sampling": every,
    }


# ---------------------------------------------------------------------------------------------------------------
# validation curves


MAX_STEP = 10**12  # a step (update number) beyond this is no run's: a malformed record


def _step(value: Any) -> int | None:
    """A record's step as an integer (fairseq's json log writes numbers as strings: "100"), or None when it is
    no update number: not a number, not whole, negative or beyond MAX_STEP."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(number) or number != int(number) or not 0 <= number <= MAX_STEP:
        return None
    return int(number)


def _record(line: bytes) -> dict[str, Any] | None:
    """The JSON object a log line holds after its first "{", or None: no "{" (not a record) or not one that
    parses (not UTF-8, not JSON, nested past seqtrain.fileio.MAX_NESTING), which the caller counts."""
    brace = line.find(b"{")
    if brace < 0:
        return None
    try:
        stats = loads_bounded(line[brace:].decode("utf-8"))
    except ValueError:  # also UnicodeDecodeError, JSONBoundsError
        return {}
    return stats if isinstance(stats, dict) else {}


def _validation_record(stats: dict[str, Any]) -> tuple[str, Any, dict[str, Any]] | None:
    """(subset, step as written, metrics) of a validation record (seqtrain's / fairseq's json log line, or a
    --jsonl-log line), or None for any other record."""
    tag = stats.get("tag")
    if isinstance(tag, str) and tag.startswith("valid") and "step" in stats:
        return tag, stats["step"], {k: v for k, v in stats.items() if k not in ("tag", "step")}
    subsets = [k[: -len("_num_updates")] for k in stats if k.endswith("_num_updates")]
    if not subsets or subsets[0] == "train" or not subsets[0].startswith("valid"):
        return None
    subset = subsets[0]
    metrics = {k[len(subset) + 1 :]: v for k, v in stats.items() if k.startswith(subset + "_")}
    return subset, stats[subset + "_num_updates"], metrics


def validation_curves(path: str) -> dict[str, Any]:
    """{"subsets": {subset: {metric: [[num_updates, value], ...]}}, "skipped": records that could not be read}
    from a training log: seqtrain-train's / fairseq-train's `--log-format json` lines (`... | valid |
    {"valid_loss": ..., "valid_num_updates": ...}`) or --jsonl-log lines ({"tag": "valid", "step": N, "loss":
    ...}). A resumed run's later lines win. A value that is not finite (a diverged run logs "nan") is kept as
    None, a gap the page marks; a record whose JSON, text or step is malformed (not UTF-8, not JSON, nested too
    deep; a step that is no whole number from 0 to MAX_STEP) is skipped and counted. Lines are read with
    seqtrain.fileio's bound on a line's length."""
    out: dict[str, dict[str, dict[int, float | None]]] = {}
    skipped = 0
    try:
        f = open(path, "rb")
    except OSError as e:
        raise SeqtrainError(f"--train-log {path}: cannot read ({e.strerror})") from None
    with f:
        for line in bounded_lines(f, f"--train-log {path}"):
            stats = _record(line)
            found = _validation_record(stats) if stats else None
            if stats == {} or found is not None and _step(found[1]) is None:
                skipped += 1
                continue
            if found is None:
                continue
            subset, step, metrics = found[0], _step(found[1]), found[2]
            for key, value in metrics.items():
                # throughput and bookkeeping are no curves; best_* repeat the best value so far
                skip = key in ("num_updates", "wall", "wps", "ups", "bsz", "wpb", "gb_free", "train_wall")
                if skip or key.startswith("best_") or isinstance(value, bool):
                    continue
                try:  # fairseq's json log writes the figures as strings ("5.123")
                    number = float(value)
                except (TypeError, ValueError, OverflowError):
                    continue
                out.setdefault(subset, {}).setdefault(key, {})[step] = (
                    number if math.isfinite(number) else None
                )
    if not out:
        more = f"; {skipped} malformed records skipped" if skipped else ""
        raise SeqtrainError(
            f"--train-log {path}: no validation records (train with --log-format json or --jsonl-log FILE){more}"
        )
    subsets = {
        s: {k: [[u, v] for u, v in sorted(pts.items())] for k, pts in m.items()} for s, m in out.items()
    }
    return {"subsets": subsets, "skipped": skipped}
