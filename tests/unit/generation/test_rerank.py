"""seqtrain-generate --rerank: MBR and length-normalised reranking equal hand computations on made n-best lists,
and on a real model they reorder the finished beam only (the same hypotheses, the chosen one first)."""

from __future__ import annotations

import io

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.generation.rerank import mbr_scores, rerank, rouge_utility
from seqtrain_cli.generate import generate_main


def _hypo(i: int, positional: list[float]) -> dict:
    return {"tokens": torch.tensor([i] * len(positional)), "positional_scores": torch.tensor(positional)}


def test_rouge_utility_by_hand():
    # "a b c" vs "a b d": ROUGE-1 2 of 3 each way -> F 2/3; ROUGE-2 ab of {ab, bc} / {ab, bd} -> 1/2;
    # ROUGE-L LCS "a b" -> 2/3
    assert rouge_utility("a b c", "a b d") == pytest.approx(100 * (2 / 3 + 1 / 2 + 2 / 3) / 3)
    assert rouge_utility("a b c", "x y z") == 0.0


def test_mbr_choice_equals_a_hand_computation():
    # the beam's order C, A, B, D. Utilities (mean of ROUGE-1/2/L F1 x 100):
    #   U(A,B) = (2/3 + 1/2 + 2/3)/3 = 61.11
    #   U(A,D): A inside D: R1 P 1 R 3/4 -> 6/7; R2 P 1 R 2/3 -> 4/5; RL 6/7        -> 83.81
    #   U(B,D): R1 6/7; R2 "a b" only: P 1/2 R 1/3 -> 2/5; RL "a b d" 6/7           -> 70.48
    #   C shares nothing.  Expected utility (/3): A 48.31, B 43.86, C 0, D 51.43 -> D, A, B, C
    texts = ["x y z", "a b c", "a b d", "a b c d"]
    u_ab = 100 * (2 / 3 + 1 / 2 + 2 / 3) / 3
    u_ad = 100 * (6 / 7 + 4 / 5 + 6 / 7) / 3
    u_bd = 100 * (6 / 7 + 2 / 5 + 6 / 7) / 3
    assert mbr_scores(texts) == pytest.approx([0.0, (u_ab + u_ad) / 3, (u_ab + u_bd) / 3, (u_ad + u_bd) / 3])
    hypos = [_hypo(i, [-1.0]) for i in range(4)]
    out = rerank(hypos, "mbr", lambda t: texts[int(t[0])])
    assert [int(h["tokens"][0]) for h in out] == [3, 1, 2, 0]
    # ties keep the beam's order; one hypothesis stays as it is
    assert rerank(hypos[:2] + hypos[:1], "mbr", lambda t: "same text")[0] is hypos[0]
    assert rerank(hypos[:1], "mbr", lambda t: "") == hypos[:1]


def test_length_normalised_reranking_by_hand():
    short = _hypo(0, [-0.25, -0.75])  # sum -1.0 over 2 tokens
    long = _hypo(1, [-0.4, -0.4, -0.4, -0.4])  # sum -1.6 over 4 tokens
    # A = 1: -0.5 against -0.4 -> the long one; A = 0: -1.0 against -1.6 -> the short one
    assert rerank([short, long], "length", str, lenpen=1.0) == [long, short]
    assert rerank([short, long], "length", str, lenpen=0.0) == [short, long]
    # A = 0.5: -1/sqrt(2) = -0.707 against -1.6/2 = -0.8 -> the short one
    assert rerank([long, short], "length", str, lenpen=0.5) == [short, long]
    with pytest.raises(SeqtrainError, match="--rerank best: choose one of length, mbr"):
        rerank([short, long], "best", str)


@pytest.fixture
def base(fairseq_tiny, tmp_path):
    src = (fairseq_tiny / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:12]
    (tmp_path / "in.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    return [str(fairseq_tiny / "data-bin"), "--path", str(fairseq_tiny / "checkpoint_last.pt"), "-s", "src",
            "-t", "tgt", "--cpu", "--beam", "4", "--batch-size", "6", "--input", str(tmp_path / "in.txt")]  # fmt: skip


def _nbest(argv: list[str], n: int = 4) -> list[list[str]]:
    out = io.StringIO()
    lines = generate_main(argv + ["--nbest", str(n)], out=out) and out.getvalue().split("\n")[:-1]
    return [lines[i : i + n] for i in range(0, len(lines), n)]


@pytest.mark.slow
def test_reranking_reorders_the_finished_beam_of_a_real_model(base):
    beam = _nbest(base)
    # the same exponent as the beam's --lenpen: the beam's own order back
    assert _nbest(base + ["--rerank", "length", "--rerank-lenpen", "1.0"]) == beam
    mbr = _nbest(base + ["--rerank", "mbr"])
    for plain, reranked in zip(beam, mbr):
        assert sorted(reranked) == sorted(plain)  # the same four hypotheses
        scores = mbr_scores(plain)
        assert reranked[0] == plain[max(range(4), key=lambda i: (scores[i], -i))]
    # --nbest 1 (the default): MBR still chooses among all four; on hot samples (which differ, unlike this
    # fixture's confident beams) its choice is often not the first sample
    hot = base + ["--sampling", "--seed", "3", "--temperature", "2.5", "--max-len-b", "12"]
    samples, chosen = _nbest(hot), _nbest(hot + ["--rerank", "mbr"], 1)
    best = [s[max(range(4), key=lambda i: (mbr_scores(s)[i], -i))] for s in samples]
    assert [c[0] for c in chosen] == best
    assert sum(c[0] != s[0] for c, s in zip(chosen, samples)) >= 3
    shorter = _nbest(base + ["--rerank", "length", "--rerank-lenpen", "0"])
    assert [sorted(x) for x in shorter] == [sorted(x) for x in beam]
    assert sum(len(a[0].split()) for a in shorter) <= sum(len(a[0].split()) for a in beam)


def test_rerank_flag_errors(base):
    with pytest.raises(SeqtrainError, match="--rerank-lenpen: only --rerank length uses it"):
        generate_main(base + ["--rerank", "mbr", "--rerank-lenpen", "2"], out=io.StringIO())
    # issue 48, class 10: one candidate (--beam 1, or a sampled beam of 1) is nothing to rerank: a silent no-op
    for method in ("mbr", "length"):
        for extra in ([], ["--sampling"]):
            with pytest.raises(SeqtrainError) as e:
                generate_main(base + ["--rerank", method, "--beam", "1", *extra], out=io.StringIO())
            assert str(e.value) == (
                f"--rerank {method} chooses among the beam's finished hypotheses, and --beam 1 leaves one: nothing "
                "to rerank; give --beam 2 or more (or drop --rerank)"
            )
