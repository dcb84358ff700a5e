"""seqtrain-generate --rerank: reorder each example's finished n-best (the beam search's hypotheses, best first) by
another criterion before the output is written. The beam search itself is untouched: reranking sees only the
hypotheses it returned (all --beam of them, not only the --nbest printed), so it can change which one is printed
first, never what the beam found.

  length   length-normalised reranking: each hypothesis' summed token log-probabilities (its positional scores)
           divided by len**--rerank-lenpen, len counting the final </s> as the beam's own normalisation does.
           --rerank-lenpen equal to --lenpen gives the beam's own order back; other values choose among the
           finished hypotheses as a different --lenpen would have scored them, without searching again.
  mbr      minimum Bayes risk decoding (Kumar & Byrne 2004; as in Freitag et al. 2022 with the n-best as both
           candidates and pseudo-references): the hypothesis with the highest expected utility against the other
           hypotheses, weighted uniformly, the utility being the mean of ROUGE-1, ROUGE-2 and ROUGE-L F1 x 100
           (rouge-score, Porter stemming, the scores seqtrain-score reports) of the detokenized texts.

With --sampling the --beam samples are reranked the same way (MBR over samples is its usual setting).
Ties keep the beam's order (the sort is stable). The hypotheses' own scores are not changed: fairseq's H-/D- lines
still print the beam's score of each hypothesis, in the new order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.scoring.rouge import rouge_scorer


@settings
class RerankConfig:
    """seqtrain-generate --rerank"""

    rerank: str | None = setting(
        None,
        "reorder each example's finished beam before output: length (summed log-probs / len**--rerank-lenpen)"
        " or mbr (minimum Bayes risk: the hypothesis with the highest mean ROUGE against the others)",
        choices=["length", "mbr"],
        not_in=("interactive",),
    )
    rerank_lenpen: float | None = setting(
        None,
        "with --rerank length: the length exponent A (default: 1.0; equal to --lenpen: the beam's own order)",
        type=float,
        metavar="A",
        not_in=("interactive",),
    )


def check_rerank(method: str | None, beam: int) -> None:
    """--rerank reorders the finished beam: with --beam 1 there is one hypothesis, nothing to choose among (a
    silent no-op before)."""
    if method and beam < 2:
        raise SeqtrainError(
            f"--rerank {method} chooses among the beam's finished hypotheses, and --beam {beam} leaves one: nothing "
            "to rerank; give --beam 2 or more (or drop --rerank)"
        )


METHODS = ("length", "mbr")
MBR_UTILITY = ("rouge1", "rouge2", "rougeL")  # F1 is symmetric in its two texts for these three


def length_scores(hypos: Sequence[dict[str, Any]], lenpen: float) -> list[float]:
    """sum(positional log-probs) / len**lenpen for each hypothesis (len: its tokens, </s> included)."""
    return [float(h["positional_scores"].double().sum()) / (len(h["tokens"]) ** lenpen) for h in hypos]


_SCORER: list[Any] = []


def rouge_utility(a: str, b: str) -> float:
    """The MBR utility of two texts: the mean of ROUGE-1, ROUGE-2 and ROUGE-L F1 x 100 (symmetric in a, b)."""
    if not _SCORER:  # one scorer for the process: building one loads the stemmer's tables
        _SCORER.append(rouge_scorer().RougeScorer(list(MBR_UTILITY), use_stemmer=True))
    scores = _SCORER[0].score(a, b)
    return 100.0 * sum(scores[k].fmeasure for k in MBR_UTILITY) / len(MBR_UTILITY)


def mbr_scores(texts: Sequence[str], utility: Callable[[str, str], float] = rouge_utility) -> list[float]:
    """Each text's expected utility against the others, uniformly weighted: sum_j!=i U(i, j) / (n - 1)."""
    n = len(texts)
    if n == 1:
        return [0.0]
    table = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            table[i][j] = table[j][i] = utility(texts[i], texts[j])
    return [sum(row) / (n - 1) for row in table]


def rerank(
    hypos: list[dict[str, Any]], method: str, decode: Callable[[Any], str], lenpen: float = 1.0
) -> list[dict[str, Any]]:
    """`hypos` (the beam's order) reordered by `method`: best first, ties in the beam's order. `decode` turns a
    hypothesis' tokens into the text MBR compares."""
    if method not in METHODS:
        raise SeqtrainError(f"--rerank {method}: choose one of {', '.join(METHODS)}")
    if len(hypos) < 2:
        return list(hypos)
    if method == "length":
        keys = length_scores(hypos, lenpen)
    else:
        keys = mbr_scores([decode(h["tokens"]) for h in hypos])
    order = sorted(range(len(hypos)), key=lambda i: -keys[i])  # stable: ties keep the beam's order
    return [hypos[i] for i in order]
