import json

import pytest

# before seqtrain.scoring, which imports it too: without rouge-score (the GPU image) the module skips
rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer", reason="rouge-score is not installed")

from seqtrain.errors import SeqtrainError  # noqa: E402
from seqtrain.scoring import format_summary, score_files, score_pairs, split_sentences  # noqa: E402
from seqtrain_cli import score as score_cli  # noqa: E402

HYPS = [
    "the cat sat on the mat. it was happy.",
    "police arrested two men on friday",
    "Running dogs ran quickly!",
]
REFS = [
    "the cat was sitting on the mat. it is happy now.",
    "two men were arrested by police on friday night",
    "the dog runs quick. it barks?",
]


def test_sentence_splitter():
    assert split_sentences('Hello there. How are you?  I am "fine." Yes! no end') == [
        "Hello there.",
        "How are you?",
        'I am "fine."',
        "Yes!",
        "no end",
    ]
    assert split_sentences("version 1.5 is out") == ["version 1.5 is out"]  # no whitespace after the dot
    assert split_sentences("   ") == []


def test_hand_computed_rouge1_and_rouge2():
    # hyp "a b c d" vs ref "a b e": unigram overlap 2 -> P 2/4, R 2/3, F1 = 2PR/(P+R) = 4/7;
    # bigram overlap 1 ("a b") -> P 1/3, R 1/2, F1 = 2/5; LCS "a b" -> same as ROUGE-1 here
    s = score_pairs(["a b c d"], ["a b e"])
    assert s["rouge1"] == pytest.approx(100 * 4 / 7)
    assert s["rouge2"] == pytest.approx(100 * 2 / 5)
    assert s["rougeL"] == pytest.approx(100 * 4 / 7)
    assert s["n"] == 1


def test_matches_rouge_score_called_directly_with_stemming():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    expected = {k: 0.0 for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
    for h, r in zip(HYPS, REFS):
        sc = scorer.score("\n".join(split_sentences(r)), "\n".join(split_sentences(h)))
        for k in expected:
            expected[k] += 100 * sc[k].fmeasure / len(HYPS)
    got = score_pairs(HYPS, REFS)
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-12)
    # newlines don't affect ROUGE-1/2/L: same as scoring the raw lines
    raw = [scorer.score(r, h) for h, r in zip(HYPS, REFS)]
    assert got["rougeL"] == pytest.approx(100 * sum(x["rougeL"].fmeasure for x in raw) / 3, rel=1e-12)
    # stemming on: "Running dogs ran" vs "dog runs" share the stems "run" and "dog"
    assert score_pairs(["running dogs"], ["dog runs"])["rouge1"] == pytest.approx(100.0)


def test_lsum_differs_from_l_on_multi_sentence_text():
    s = score_pairs(["c d. a b."], ["a b. c d."])
    # whole-text LCS of "c d a b" vs "a b c d" is 2 tokens -> 50; sentence by sentence, each reference sentence
    # is matched completely by one hypothesis sentence -> Lsum 100
    assert s["rougeL"] == pytest.approx(50.0)
    assert s["rougeLsum"] == pytest.approx(100.0)
    single = score_pairs(["c d a b"], ["a b c d"])
    assert single["rougeLsum"] == pytest.approx(single["rougeL"])  # one sentence: identical


def test_score_files_and_line_count_mismatch(tmp_path):
    sys_f, ref_f = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    sys_f.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref_f.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    assert score_files(str(sys_f), str(ref_f)) == score_pairs(HYPS, REFS)
    ref_f.write_text("\n".join(REFS[:2]) + "\n", encoding="utf-8")
    with pytest.raises(SeqtrainError, match=rf"{sys_f} has 3 lines, {ref_f} has 2"):
        score_files(str(sys_f), str(ref_f))
    with pytest.raises(SeqtrainError, match="cannot read"):
        score_files(str(tmp_path / "missing.txt"), str(ref_f))


def test_empty_hypothesis_line_scores_zero(tmp_path):
    sys_f, ref_f = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    sys_f.write_text("a b\n\n", encoding="utf-8")
    ref_f.write_text("a b\nc d\n", encoding="utf-8")
    s = score_files(str(sys_f), str(ref_f))
    assert s["n"] == 2 and s["rouge1"] == pytest.approx(50.0)


def test_cli_prints_summary_and_writes_json(tmp_path, capsys):
    sys_f, ref_f, out = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "sub" / "rouge.json"
    sys_f.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref_f.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        score_cli.cli_main(["--sys", str(sys_f), "--ref", str(ref_f), "--json", str(out)])
    assert e.value.code == 0
    expected = score_pairs(HYPS, REFS)
    line = capsys.readouterr().out.strip()
    assert line == format_summary(expected)
    assert line.startswith(f"ROUGE-1 {expected['rouge1']:.2f} | ROUGE-2 {expected['rouge2']:.2f}")
    data = json.loads(out.read_text())
    assert data["rougeLsum"] == pytest.approx(expected["rougeLsum"]) and data["n"] == 3
    assert data["sys"] == str(sys_f) and data["ref"] == str(ref_f)

    ref_f.write_text("only one\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        score_cli.cli_main(["--sys", str(sys_f), "--ref", str(ref_f)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("seqtrain-score: error: line counts differ") and err.count("\n") == 1


# ---- issue 31: lines bounded before scoring (ROUGE-L's LCS table grows with the product of the lengths)
def test_a_line_past_max_words_is_refused_before_scoring(tmp_path):
    """Before: a 20,000-word line went into rouge-score's LCS table (7.8 GB, minutes)."""
    from seqtrain.scoring.rouge import MAX_WORDS

    ok = " ".join(["word"] * MAX_WORDS)  # at the cap: scored
    long = "x, " * (MAX_WORDS + 1)  # rouge-score's tokens: runs of a-z0-9, so 4097 words
    (tmp_path / "sys.txt").write_text(f"a b\n{long}\n")
    (tmp_path / "ref.txt").write_text(f"a b\n{ok}\n")
    with pytest.raises(SeqtrainError) as e:
        score_files(str(tmp_path / "sys.txt"), str(tmp_path / "ref.txt"))
    assert str(e.value) == (
        f"{tmp_path / 'sys.txt'}:2: 4097 words, more than the 4096 ROUGE scores per line (ROUGE-L's time and "
        "memory grow with the product of the two lines' lengths); shorten or split the line"
    )
    with pytest.raises(SeqtrainError, match=r"^reference 1: 4097 words, more than the 4096"):
        score_pairs(["a"], [long])
    assert score_pairs([ok[:999]], [ok[:999]])["rouge1"] == pytest.approx(100.0)


def test_sigterm_while_scoring_is_one_line_and_143(tmp_path, monkeypatch, capsys):
    """SIGTERM's default action ended seqtrain-score without a word (and before, with 7.8 GB in use, it
    seemed ignored); now scoring stops at once: `stopped by SIGTERM; nothing was written`, 143, no --json."""
    import os
    import signal

    import seqtrain.scoring.rouge as rouge

    def terminated(hyps, refs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode
        raise AssertionError("SIGTERM did not stop scoring")

    (tmp_path / "h.txt").write_text("a b\n")
    monkeypatch.setattr(rouge, "example_scores", terminated)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        score_cli.cli_main(["--sys", str(tmp_path / "h.txt"), "--ref", str(tmp_path / "h.txt"), "--json",
                            str(tmp_path / "s.json")])  # fmt: skip
    assert e.value.code == 143
    assert capsys.readouterr().err == "seqtrain-score: stopped by SIGTERM; nothing was written\n"
    assert not (tmp_path / "s.json").exists() and signal.getsignal(signal.SIGTERM) is before
