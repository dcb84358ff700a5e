"""scripts/bench_host_overhead.py prints its side-by-side table: one row per variant, each with a positive
time and its ratio to transformers (the figures themselves are benchmarks, not asserted)."""

import pytest

from tests.utils import script_table_rows


@pytest.mark.slow
def test_prints_a_row_per_variant_with_numbers():
    pytest.importorskip("transformers")
    row = r"^\| (seqtrain|seqtrain, nested|transformers) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$"
    rows = script_table_rows("bench_host_overhead", ["--steps", "2", "--rounds", "1"], row, timeout=600)
    assert [r[0] for r in rows] == ["seqtrain", "seqtrain, nested", "transformers"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert rows[2][3] == "1.00"
