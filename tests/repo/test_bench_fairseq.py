"""scripts/bench/bench_fairseq.py without the fairseq peer, and its reading of both tools' per-update json logs
(lines as fairseq 0.12 and seqtrain-train print them)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[2])
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))

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
    script = os.path.join(ROOT, "scripts", "bench", "bench_fairseq.py")
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


def test_summary_and_table_put_seqtrain_bf16_generation_beside_fairseq():
    """With --seqtrain-bf16 the generation rows hold seqtrain's fp32 and bf16 runs, each against fairseq's fp32
    run: speed, hypotheses identical to fairseq's, memory."""
    import argparse

    args = argparse.Namespace(updates=2, rounds=1, max_tokens=2048)

    def gen_run(sps, rss, hyps):
        return {
            "sentences": len(hyps),
            "sentences_per_s": sps,
            "peak_rss_gb": rss,
            "peak_pss_gb": rss,
            "hyps": hyps,
        }

    ref = {0: "a b", 1: "c d", 2: "e f"}
    gen = {
        "bart_base": {
            "seqtrain": [gen_run(3.0, 1.0, dict(ref))],
            "fairseq": [gen_run(2.0, 2.0, ref)],
            "seqtrain-bf16": [gen_run(8.0, 0.5, {0: "a b", 1: "c x", 2: "e f"})],
        }
    }
    report = bench_fairseq.summarize(args, {"fp32": 1e11, "bf16": 4e11}, 2e9, {}, gen, 2)
    res = report["generate"]["bart_base"]
    assert res["seqtrain"]["speedup_vs_fairseq"] == pytest.approx(1.5)
    assert res["seqtrain-bf16"]["speedup_vs_fairseq"] == pytest.approx(4.0)
    assert res["seqtrain-bf16"]["memory_vs_fairseq"] == pytest.approx(0.25)
    assert (res["seqtrain"]["identical_to_fairseq"], res["seqtrain-bf16"]["identical_to_fairseq"]) == (3, 2)
    text = bench_fairseq.table(report)
    assert "| generation bart_base: sentences/s | 3.00 | 2.00 | 1.50x |" in text
    assert "| generation bart_base seqtrain-bf16: sentences/s | 8.00 | 2.00 | 4.00x |" in text
    assert "| generation bart_base seqtrain-bf16: best hypotheses identical | 2 / 3 | | |" in text
