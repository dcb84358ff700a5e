"""seqtrain-tune end to end, as console programs: it tunes on a data-bin's valid split, and the preset it writes
reproduces its best run through seqtrain-generate --config (the same ROUGE on the whole split, with the given
settings' run as the baseline); generation_config.json reads back as the same settings; a bad grid is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from seqtrain.checkpoint.hf import read_generation_config
from tests.utils import REPO


def _run(module, args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=300
    )


def _model(fairseq_tiny):
    return [str(fairseq_tiny / "data-bin"), "--path", str(fairseq_tiny / "checkpoint_last.pt"), "--cpu"]


def test_preset_reproduces_the_best_run(fairseq_tiny, tmp_path):
    out = tmp_path / "tuned"
    proc = _run(
        "seqtrain_cli.tune",
        _model(fairseq_tiny)
        + ["--max-len-b", "3", "--tune", "max-len-b,lenpen", "--tune-grid", "max-len-b=2,4,8;lenpen=0.5,2"]
        + ["--tune-subset", "40", "--tune-bootstrap", "200", "--tune-output", str(out), "--batch-size", "50"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["search"] == "coordinate" and result["split"] == "valid" and result["subset"]["n"] == 40
    best, given = result["best"], result["given"]
    assert given["max_len_b"] == 3 and best["max_len_b"] in (4, 8) and best != given
    # the table: the settings side by side, then each ROUGE with its interval and the gain
    table = proc.stdout
    assert (
        "max-len-b" in table and "ROUGE-Lsum" in table and "valid, all 200 examples (searched on 40" in table
    )
    gain = result["full"]["gain"]["rougeLsum"]
    assert gain > 0 and f"{gain:+.2f}" in table

    preset = (out / "generation.yaml").read_text()
    assert f"max-len-b: {best['max_len_b']}\n" in preset and f"lenpen: {float(best['lenpen'])!r}\n" in preset
    for name, settings, config in (
        ("best", best, ["--config", str(out / "generation.yaml")]),
        ("given", given, []),
    ):
        res = tmp_path / name
        proc = _run(
            "seqtrain_cli.generate",
            _model(fairseq_tiny)
            + ["--gen-subset", "valid", "--scoring", "rouge", "--quiet", "--results-path", str(res)]
            + (config or ["--max-len-b", "3"]),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        rouge = json.loads((res / "rouge-valid.json").read_text())
        assert rouge["beam"] == settings["beam"] and rouge["lenpen"] == settings["lenpen"]
        for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
            assert rouge[k] == result["full"][name]["rouge"][k], (name, k)

    # generation_config.json, as seqtrain-convert --to hf writes it, reads back as the best settings
    found, forced_bos, _ = read_generation_config(str(out))
    assert {k: found[k] for k in best} == best and forced_bos is None


def test_bad_grid_is_one_line(fairseq_tiny, tmp_path):
    proc = _run(
        "seqtrain_cli.tune",
        _model(fairseq_tiny)
        + ["--tune-grid", "lenpen=0.6,1.0;beam=2,-4", "--tune-output", str(tmp_path / "t")],
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().split("\n")
    assert len(lines) == 1 and "--tune-grid" in lines[0] and "beam=-4" in lines[0], proc.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_sigterm_during_the_search_is_one_line_and_143_leaving_no_folder(fairseq_tiny, tmp_path):
    """Issue 48, class 10: SIGTERM killed seqtrain-tune without its line (-15) and left its empty --tune-output
    folder; now it ends as the other programs do (143, `stopped by SIGTERM`), and the folder is made only when
    the files are written."""
    import signal
    import time

    out = tmp_path / "tuned"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = _model(fairseq_tiny) + ["--tune-subset", "200", "--tune-output", str(out), "--batch-size", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqtrain_cli.tune", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "searching " not in seen:  # the search has begun (its first log line)
            assert proc.poll() is None and time.monotonic() < deadline, seen
            seen += proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = [ln for ln in stderr.splitlines() if " | INFO | " not in ln]
    assert (proc.returncode, stdout, lines) == (
        143,
        "",
        [f"seqtrain-tune: stopped by SIGTERM; nothing was written to --tune-output {out}"],
    )
    assert not out.exists()
