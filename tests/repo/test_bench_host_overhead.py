"""scripts/bench/bench_host_overhead.py prints its side-by-side table: one row per variant, each with a positive
time and its ratio to transformers (the figures themselves are benchmarks, not asserted)."""

import re

import pytest

from tests.utils import script_output


@pytest.mark.slow
@pytest.mark.parametrize("precision", [[], ["--bf16"]], ids=["fp32", "bf16"])
def test_prints_a_row_per_variant_with_time_and_operator_counts(precision):
    pytest.importorskip("transformers")
    row = r"^\| (seqtrain|seqtrain, nested|transformers) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| ([\d.]+)x \|$"
    args = ["--steps", "2", "--rounds", "1", *precision]
    out = script_output("bench/bench_host_overhead", args, timeout=600)
    assert ("bf16 autocast;" if precision else "fp32;") in out
    rows = re.findall(row, out, re.M)
    assert [r[0] for r in rows] == ["seqtrain", "seqtrain, nested", "transformers"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert rows[2][4] == "1.00"
    ops = {r[0]: int(r[3]) for r in rows}
    # 12 + 12 layers: thousands of operators a step in each toolkit; autocast adds its casts
    assert all(n > 3000 for n in ops.values())
    if precision:  # autocast's casts: 4,834 a step with packed training (4,097 in fp32)
        assert ops["seqtrain"] > 4000
    # the nested autograd pass of the old FFN backward dispatches one more operator per layer, not fewer
    assert ops["seqtrain, nested"] >= ops["seqtrain"]


@pytest.mark.slow
def test_generate_prints_time_and_operator_counts_of_both_toolkits_with_identical_hypotheses():
    pytest.importorskip("transformers")
    args = ["--generate", "--batches", "1", "--batch-size", "2", "--rounds", "1"]
    out = script_output("bench/bench_host_overhead", args, timeout=600)
    # identical weights in fp32: the same best hypotheses
    assert re.findall(r"best hypotheses identical: (\d+)/(\d+);", out) == [("2", "2")]
    rows = re.findall(
        r"^\| (seqtrain|transformers) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| ([\d.]+)x \|$", out, re.M
    )
    assert [r[0] for r in rows] == ["seqtrain", "transformers"]
    assert all(float(r[1]) > 0 and int(r[3]) > 1000 for r in rows)  # a decoding step dispatches hundreds
    assert rows[1][4] == "1.00"
