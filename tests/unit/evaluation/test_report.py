"""seqtrain-eval's figures against hand computations on four made examples (the numbers in the comments are
worked out from the texts, not read back from the code)."""

from __future__ import annotations

import json

import pytest

from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.evaluation import analyses
from seqtrain.evaluation.report import EvalConfig, get_eval_parser, report
from seqtrain.flags.parsers import UsageError

SOURCES = [
    "Alice met Bob in Paris. They talked.",  # 7 words
    "The price rose to 1,200 dollars in 2020.",  # 9 words (1,200 is two tokens)
    "Carol visited London last week. It rained.",  # 7 words
    "x y z w",  # 4 words
]
REFERENCES = ["Alice met Bob in Paris.", "price rose to 1,200 dollars", "carol visited london", "q r"]
# two hypotheses equal their references (ROUGE 100), two share no word with them (ROUGE 0)
HYPOTHESES = ["Alice met Bob in Paris.", "price rose to 1,200 dollars", "Dave saw 7 cats in Berlin", "s t"]
OTHER = ["alice", "price", "carol visited london", "s t"]
TRAIN = [
    "Alice met Bob in Paris. They talked.",
    "completely other text here now please ok",
    "carol visited london last week it rained today too",
]


def _write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


def example_files(tmp_path) -> dict:
    """The four made examples' files in `tmp_path` (also tests/e2e/test_eval_inputs.py's)."""
    return {
        "hyps": _write(tmp_path / "hyp.txt", HYPOTHESES),
        "other": _write(tmp_path / "other.txt", OTHER),
        "source": _write(tmp_path / "valid.source", SOURCES),
        "reference": _write(tmp_path / "valid.target", REFERENCES),
        "train": _write(tmp_path / "train.source", TRAIN),
    }


@pytest.fixture
def files(tmp_path):
    return example_files(tmp_path)


def _args(files, *extra) -> EvalConfig:
    """seqtrain-eval's settings for these files and flags, read from its parser as seqtrain-eval reads them."""
    argv = ["--hyps", files["hyps"], "--source", files["source"], "--reference", files["reference"], *extra]
    return from_args(EvalConfig, get_eval_parser().parse_args(argv))


def test_rouge_baselines_and_oracle(files):
    r = report(_args(files, "--bootstrap", "200"))
    assert r["n"] == 4
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert r["rouge"][k] == pytest.approx(50.0)  # (100 + 100 + 0 + 0) / 4
        lo, hi = r["rouge"]["ci"][k]
        assert 0.0 <= lo <= 50.0 <= hi <= 100.0
    # lead-1 ROUGE-1: 100 (the reference itself); 80 (6 of 9 words are the reference's 6: P 2/3, R 1);
    # 75 (3 of 5 words: P 3/5, R 1); 0
    assert r["baselines"]["lead-1"]["rouge1"] == pytest.approx((100 + 80 + 75 + 0) / 4)
    # the oracle picks the same first sentences (a second lowers ROUGE-1 + ROUGE-2), and nothing for "x y z w"
    assert r["baselines"]["oracle"]["rouge1"] == pytest.approx((100 + 80 + 75 + 0) / 4)
    assert r["baselines"]["oracle"]["mean_sentences"] == pytest.approx(3 / 4)
    assert [e["oracle_sentences"] for e in r["examples"]] == [[0], [0], [0], []]


def test_oracle_greedy_choice_by_hand():
    # s0 alone: R1 F 2/3 + R2 F 4/7 = 1.238; s2 alone: 0.4 + 0.25 = 0.65 -> s0. Then s0+s2 ("the cat sat the mat
    # was red"): R1 5/7, 5/6 -> F 10/13; R2 3/6, 3/5 -> F 6/11; sum 1.315 > 1.238 -> s2 joins; s1 lowers it.
    text, ids = analyses.oracle("the cat sat. a dog ran. the mat was red.", "the cat sat on the mat")
    assert ids == [0, 2]
    assert text == "the cat sat. the mat was red."
    assert analyses.lead("A b. C d! E f", 2) == "A b. C d!"


def test_lengths_buckets_faithfulness_truncation(files):
    r = report(_args(files, "--bootstrap", "0", "--buckets", "2", "--source-limit", "3"))
    L = r["lengths"]
    # hypothesis words 5, 6 (1,200 is two), 6, 2
    assert L["hypothesis"] == {"mean": 4.75, "median": 5.5, "p90": 6.0, "min": 2, "max": 6}
    assert L["source"]["mean"] == pytest.approx((7 + 9 + 7 + 4) / 4)
    # source lengths 7 9 7 4: the median by numpy's 'lower' rule is 7 -> buckets 4-7 (ids 0, 2, 3) and 8-9 (id 1)
    assert [(b["source_words"], b["ids"]) for b in r["buckets"]] == [("4-7", [0, 2, 3]), ("8-9", [1])]
    assert r["buckets"][0]["rouge"]["rouge1"] == pytest.approx(100 / 3)
    assert r["buckets"][1]["rouge"]["rouge1"] == pytest.approx(100.0)
    # hypotheses: Bob, Paris (present); 1200 (present as 1,200); 7, Berlin absent (Dave starts the sentence)
    f = r["faithfulness"]["hypothesis"]
    assert (f["items"], f["absent"], f["absent_share"], f["examples_with_absent"]) == (5, 2, 0.4, 1)
    assert r["examples"][2]["absent"] == ["7", "Berlin"]
    assert r["faithfulness"]["reference"]["items"] == 3 and r["faithfulness"]["reference"]["absent"] == 0
    # past 3 words: "in paris" (2 of 5 reference words), "to 1 200 dollars" (4 of 6), none, none
    t = r["truncation"]
    assert t["reference_past_limit_mean"] == pytest.approx((2 / 5 + 4 / 6) / 4)
    assert (t["sources_over_limit"], t["references_with_words_past_limit"]) == (4, 2)


def test_duplicates_worst_best_and_compare(files):
    r = report(
        _args(
            files,
            "--bootstrap",
            "200",
            "--buckets",
            "2",
            "--examples",
            "1",
            "--train-source",
            files["train"],
            "--compare",
            files["other"],
        )  # fmt: skip
    )
    d = r["duplicates"]
    # example 0 is train's first source word for word; all three 5-grams of example 2 are in train's third
    assert (d["exact"], d["exact_ids"], d["high_overlap"], d["high_overlap_ids"]) == (1, [0], 2, [0, 2])
    assert (r["worst"], r["best"]) == ([2], [0])  # ROUGE-Lsum 0, 0, then 100, 100: ties by the lower id
    # OTHER's ROUGE-1: "alice" P 1 R 1/5 -> 1/3; "price" P 1 R 1/6 -> 2/7; 100; 0
    other = [100 / 3, 200 / 7, 100.0, 0.0]
    c = r["compare"]
    assert c["rouge"]["rouge1"] == pytest.approx(sum(other) / 4)
    assert c["test"]["rouge1"]["delta"] == pytest.approx(50 - sum(other) / 4)
    assert c["buckets"][0]["delta"]["rouge1"] == pytest.approx(100 / 3 - (other[0] + other[2] + other[3]) / 3)
    assert c["buckets"][1]["delta"]["rouge1"] == pytest.approx(100 - other[1])
    assert r["examples"][2]["compare_hypothesis"] == "carol visited london"


def test_validation_curves_from_both_log_formats(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        '2026-12-01 10:00:00 | INFO | train_inner | {"loss": 9.1, "num_updates": 10}\n'
        '2026-12-01 10:00:05 | INFO | valid | {"valid_loss": "7.5", "valid_nll_loss": 7.0, '
        '"valid_num_updates": 100, "valid_best_loss": 7.5}\n'
        '{"tag": "valid1", "step": 200, "loss": 6.25, "rougeLsum": 31.5}\n'
        '2026-12-01 10:01:00 | INFO | valid | {"valid_loss": 6.5, "valid_num_updates": 200}\n'
    )
    curves = analyses.validation_curves(str(log))
    assert curves["subsets"] == {
        "valid": {"loss": [[100, 7.5], [200, 6.5]], "nll_loss": [[100, 7.0]]},
        "valid1": {"loss": [[200, 6.25]], "rougeLsum": [[200, 31.5]]},
    }
    assert curves["skipped"] == 0
    (tmp_path / "empty.log").write_text("no json here\n")
    with pytest.raises(SeqtrainError, match=r"--train-log .*empty.log: no validation records"):
        analyses.validation_curves(str(tmp_path / "empty.log"))


def test_bad_input_is_one_line_naming_the_file(files, tmp_path):
    short = _write(tmp_path / "short.txt", HYPOTHESES[:3])
    with pytest.raises(SeqtrainError) as e:
        report(_args({**files, "hyps": short}))
    assert str(e.value) == (
        f"{short}: 3 hypotheses but {files['reference']} has 4 references (one line each, same order)"
    )
    folder = tmp_path / "results"
    folder.mkdir()
    for split in ("valid", "test"):
        _write(folder / f"hypotheses-{split}.txt", HYPOTHESES)
    with pytest.raises(
        SeqtrainError, match=r"hypotheses-test.txt, hypotheses-valid.txt; choose the split with"
    ):
        report(_args({**files, "hyps": str(folder)}))
    r = report(_args({**files, "hyps": str(folder)}, "--split", "valid", "--bootstrap", "0"))
    assert r["hypotheses"] == str(folder / "hypotheses-valid.txt") and r["rouge"]["rouge1"] == pytest.approx(
        50
    )
    json.dumps(r)  # the report is plain JSON


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--buckets", "0", "must be between 1 and 2147483647, got 0"),
        ("--source-limit", "0", "must be between 1 and 2147483647, got 0"),
        ("--dup-threshold", "0", "must be above 0 and at most 1, got 0"),
        ("--dup-threshold", "1.5", "must be above 0 and at most 1, got 1.5"),
        ("--lead", "1,0", "must be between 1 and 2147483647, got 0"),
        ("--examples", "-1", "must be between 0 and 2147483647, got -1"),
        ("--bootstrap", "-1", "must be between 0 and 1000000, got -1"),
    ],
)
def test_ranges_are_the_fields_and_checked_as_the_flags_are_parsed(files, flag, value, message):
    """seqtrain-eval's ranges are declared on its settings' fields (bounds=): a value outside is refused by the
    parser with one line naming the flag, before anything is read."""
    with pytest.raises(UsageError, match=f"argument {flag}: {message}"):
        _args(files, flag, value)
    assert _args(files, "--dup-threshold", "1", "--lead", "2").report.lead == [2]
