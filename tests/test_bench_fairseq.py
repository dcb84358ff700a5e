"""scripts/bench_fairseq.py without the fairseq peer, and its reading of both tools' per-update json logs
(lines as fairseq 0.12 and seqtrain-train print them)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_fairseq  # noqa: E402

FAIRSEQ_LINES = [
    '2026-11-30 15:24:42 | INFO | train_inner | {"epoch": 1, "update": 0.004, "loss": "13.259", "wps": "0", '
    '"wpb": "83", "bsz": "8", "num_updates": "1"}',
    '2026-11-30 15:24:49 | INFO | train_inner | {"epoch": 1, "update": 0.008, "loss": "13.174", '
    '"wps": "37.9", "wpb": "270", "bsz": "24", "num_updates": "2"}',
    '2026-11-30 15:24:53 | INFO | train_inner | {"epoch": 1, "update": 0.011, "loss": "13.093", '
    '"wps": "24.2", "wpb": "100", "bsz": "8", "num_updates": "3"}',
]
SEQTRAIN_LINES = [
    '2026-11-30 15:23:15 | INFO | train_inner | {"epoch": 1, "update": 0.004, "loss": 13.098, "wps": 15.5, '
    '"wpb": 185.0, "bsz": 16.0, "num_updates": 1}',
    '2026-11-30 15:23:28 | INFO | train_inner | {"epoch": 1, "update": 0.008, "loss": 13.19, "wps": 9.5, '
    '"wpb": 122.0, "bsz": 16.0, "num_updates": 2}',
]


def test_exits_2_with_a_message_without_the_peer(tmp_path):
    env = {**os.environ, "FAIRSEQ_PEER": str(tmp_path / "no-fairseq")}
    script = os.path.join(ROOT, "scripts", "bench_fairseq.py")
    out = subprocess.run(
        [sys.executable, script, "--updates", "1"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 2
    assert "fairseq 0.12 is not installed at" in out.stderr and "fairseq-peer.sh" in out.stderr


@pytest.mark.parametrize(
    "lines,tokens_per_s,first,last",
    [
        (FAIRSEQ_LINES, (270 + 100) / (270 / 37.9 + 100 / 24.2), 13.259, 13.093),
        (SEQTRAIN_LINES, 9.5, 13.098, 13.19),
    ],
)
def test_reads_both_tools_json_logs(tmp_path, lines, tokens_per_s, first, last):
    log = tmp_path / "train.log"
    log.write_text("\n".join(["some start-up line", *lines, "done"]) + "\n")
    res = bench_fairseq.parse_train_log(str(log))
    assert res["updates"] == len(lines)
    assert res["tokens_per_s"] == pytest.approx(tokens_per_s)  # the first update is not timed
    assert (res["first_loss"], res["last_loss"]) == (first, last)
