"""scripts/bench/bench_host_memory.py prints its side-by-side table: glibc's defaults and malloc set to keep freed
memory, each with a positive time, its page faults and peak memory (the figures are benchmarks, not asserted;
docs/benchmarks.md has them)."""

import platform

import pytest

from tests.utils import script_table_rows


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the variants are glibc malloc settings")
def test_prints_both_variants_side_by_side():
    args = ["--arch", "bart_tiny", "--rounds", "1", "--steps", "1"]  # the docstring's plumbing run
    row = r"^\| (glibc defaults|freed memory kept) \| ([\d.]+) \| (\d+) \| (\d+) \| ([\d.]+)x \|$"
    rows = script_table_rows("bench/bench_host_memory", args, row, timeout=300)
    assert [r[0] for r in rows] == ["glibc defaults", "freed memory kept"]
    assert all(float(r[1]) > 0 and int(r[3]) > 0 for r in rows)
    assert rows[0][4] == "1.00"
