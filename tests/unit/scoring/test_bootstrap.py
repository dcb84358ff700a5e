"""seqtrain-score --bootstrap / --compare: percentile intervals and the paired bootstrap test, on cases whose
answer can be worked out by hand."""

import json
import math

import pytest

pytest.importorskip("rouge_score.rouge_scorer", reason="rouge-score is not installed")

from seqtrain.errors import SeqtrainError  # noqa: E402
from seqtrain.scoring import rouge  # noqa: E402
from seqtrain_cli import score as score_cli  # noqa: E402

TYPES = rouge.ROUGE_TYPES


def per(values):
    """The same per-example scores for every ROUGE type."""
    return {k: list(map(float, values)) for k in TYPES}


def test_identical_systems_no_difference_and_p_one():
    a = per([10, 40, 55, 70, 90])
    test = rouge.paired_bootstrap(a, per([10, 40, 55, 70, 90]), 500, seed=3)
    for k in TYPES:
        assert test[k] == {"delta": 0.0, "a_wins": 0.0, "ties": 1.0, "p_value": 1.0}


def test_dominated_system():
    # A is higher than B on every example, so every resample's mean is higher: A wins all, p = 0 (< 1/N)
    a, b = per([50, 60, 70, 80]), per([40, 59, 10, 79])
    test = rouge.paired_bootstrap(a, b, 1000, seed=1)
    back = rouge.paired_bootstrap(b, a, 1000, seed=1)
    for k in TYPES:
        assert test[k]["delta"] == pytest.approx((10 + 1 + 60 + 1) / 4)
        assert (test[k]["a_wins"], test[k]["ties"], test[k]["p_value"]) == (1.0, 0.0, 0.0)
        assert back[k]["delta"] == pytest.approx(-test[k]["delta"])
        assert (back[k]["a_wins"], back[k]["p_value"]) == (0.0, 0.0)


def test_one_better_example_of_four_matches_the_binomial_count():
    # A beats B on example 0 only, ties elsewhere: a resample of 4 ties unless it draws example 0,
    # which it misses with probability (3/4)^4 = 0.3164; so a_wins = 0.6836 and p = 2 * 0.3164
    a, b = per([30, 20, 20, 20]), per([10, 20, 20, 20])
    test = rouge.paired_bootstrap(a, b, 20000, seed=7)["rouge1"]
    miss = 0.75**4
    assert test["a_wins"] == pytest.approx(1 - miss, abs=0.015)
    assert test["ties"] == pytest.approx(miss, abs=0.015)
    assert test["p_value"] == pytest.approx(2 * miss, abs=0.03)
    assert test["a_wins"] + test["ties"] == 1.0


def test_intervals_contain_the_estimate_and_narrow_with_more_examples():
    base = [0, 100, 20, 80, 50, 35]
    widths = []
    for copies in (1, 4, 16):
        values = base * copies
        ci = rouge.bootstrap_intervals(per(values), 2000, seed=1)
        mean = sum(values) / len(values)
        lo, hi = ci["rouge2"]
        assert lo < mean < hi
        # the normal approximation: +-1.96 standard errors (population sd / sqrt(n))
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        assert hi - lo == pytest.approx(2 * 1.96 * sd / math.sqrt(len(values)), rel=0.15)
        widths.append(hi - lo)
    assert widths[0] > 1.7 * widths[1] > 1.7 * 1.7 * widths[2]  # sqrt(4) = 2 each time
    # every example scoring the same: the interval is that point
    assert rouge.bootstrap_intervals(per([42] * 7), 100)["rougeL"] == (42.0, 42.0)


def test_seeded_runs_are_identical_and_seeds_differ():
    a, b = per([5, 60, 30, 90, 10, 45, 70]), per([15, 50, 30, 70, 20, 45, 60])
    assert rouge.bootstrap_intervals(a, 300, seed=5) == rouge.bootstrap_intervals(a, 300, seed=5)
    assert rouge.bootstrap_intervals(a, 300, seed=5) != rouge.bootstrap_intervals(a, 300, seed=6)
    assert rouge.paired_bootstrap(a, b, 300, seed=5) == rouge.paired_bootstrap(a, b, 300, seed=5)
    with pytest.raises(SeqtrainError, match="at least 1 resample"):
        rouge.bootstrap_intervals(a, 0)
    with pytest.raises(SeqtrainError, match="7 examples in system A but 6"):
        rouge.paired_bootstrap(a, per([1] * 6), 10)


REFS = [
    "the cat sat on the mat today",
    "two men were arrested by police",
    "the dog runs quick",
    "the stock market fell today",
]
GOOD = [
    "the cat sat on the mat",
    "police arrested two men",
    "dogs ran quickly",
    "the market fell sharply today",
]
SHORT = ["the cat sat", "police men", "cats", "market"]


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_cli_prints_intervals_and_the_test_and_writes_them_to_json(tmp_path, capsys):
    ref, good, short = (
        write(tmp_path / "ref", REFS),
        write(tmp_path / "a", GOOD),
        write(tmp_path / "b", SHORT),
    )
    out = str(tmp_path / "s.json")
    argv = [
        "--sys",
        good,
        "--ref",
        ref,
        "--bootstrap",
        "400",
        "--seed",
        "2",
        "--compare",
        short,
        "--json",
        out,
    ]
    score_cli.main(argv)
    printed = capsys.readouterr().out.splitlines()
    data = json.loads(open(out).read())
    point = rouge.score_files(good, ref)
    assert data["rouge1"] == pytest.approx(point["rouge1"]) and data["n"] == 4
    assert (data["bootstrap"], data["seed"]) == (400, 2)
    per_a = rouge.example_scores(GOOD, REFS)
    assert data["ci"] == {k: list(v) for k, v in rouge.bootstrap_intervals(per_a, 400, seed=2).items()}
    for k in TYPES:
        assert data["ci"][k][0] <= data[k] <= data["ci"][k][1]
    cmp_ = data["compare"]
    assert cmp_["sys"] == short and cmp_["scores"]["rouge1"] == pytest.approx(
        rouge.score_files(short, ref)["rouge1"]
    )
    # GOOD scores higher on every example in ROUGE-1: A better in every resample
    assert cmp_["test"]["rouge1"]["a_wins"] == 1.0 and cmp_["test"]["rouge1"]["p_value"] == 0.0
    # ROUGE-2: example 3 ("dogs ran quickly") has no shared bigram in either system, a tie; A wins every other,
    # so only the 1-in-4^4 resamples of example 3 alone tie
    assert cmp_["test"]["rouge2"]["ties"] == pytest.approx(1 / 256, abs=0.01)
    assert printed[0] == rouge.format_summary(point)
    lo, hi = data["ci"]["rouge1"]
    assert (
        printed[1].startswith("95% CI (bootstrap 400, seed 2): ")
        and f"ROUGE-1 {lo:.2f}-{hi:.2f}" in printed[1]
    )
    assert printed[2].startswith(f"{short}: ROUGE-1 ")
    assert printed[4].startswith("  ROUGE-1: A-B +") and printed[4].endswith("| p 0.0000")
    # again with the same seed: the same file
    out2 = str(tmp_path / "s2.json")
    score_cli.main(argv[:-1] + [out2])
    assert open(out2).read() == open(out).read()


def test_cli_compare_identical_files_and_default_resamples(tmp_path, capsys):
    ref, good = write(tmp_path / "ref", REFS), write(tmp_path / "a", GOOD)
    same = write(tmp_path / "same", GOOD)
    result = score_cli.main(["--sys", good, "--ref", ref, "--compare", same]) or None
    assert result is None
    text = capsys.readouterr().out
    assert "paired bootstrap against" in text and "(1000 resamples, seed 1)" in text
    assert text.count("A-B +0.00 | A better in 0.000 of resamples | p 1.0000") == 4


def test_cli_compare_with_other_line_count_is_one_line(tmp_path, capsys):
    ref, good, short = (
        write(tmp_path / "ref", REFS),
        write(tmp_path / "a", GOOD),
        write(tmp_path / "b", SHORT[:3]),
    )
    with pytest.raises(SystemExit) as e:
        score_cli.cli_main(["--sys", good, "--ref", ref, "--compare", short])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqtrain-score: error: line counts differ: {short} has 3 lines, {ref} has 4"]
