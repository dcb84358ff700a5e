"""scripts/bench_host_overhead.py prints its side-by-side table: one row per variant, each with a positive
time and its ratio to transformers (the figures themselves are benchmarks, not asserted)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_prints_a_row_per_variant_with_numbers():
    pytest.importorskip("transformers")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "bench_host_overhead.py"),
            "--steps",
            "2",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = r"^\| (seqtrain|seqtrain, nested|transformers) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$"
    rows = re.findall(row, proc.stdout, re.M)
    assert [r[0] for r in rows] == ["seqtrain", "seqtrain, nested", "transformers"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert rows[2][3] == "1.00"
