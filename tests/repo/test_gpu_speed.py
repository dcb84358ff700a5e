"""scripts/gpu/gpu_speed.sh --dry-run: every stage of the prepared GPU speed run runs on the CPU with tiny shapes
(or is skipped with its reason) and writes its figures to $OUT/gpu_speed.json and a table to $OUT/gpu_speed.md;
a run whose budget is spent skips the stages that no longer fit."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = [
    "env",
    "ceilings",
    "attention",
    "packed_vs_padded",
    "merged_update",
    "train_ab",
    "determinism",
    "transformers",
    "generate",
]


def _run(tmp_path, *args):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu" / "gpu_speed.sh"), "--dry-run", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_speed.json").read_text()), out


def _numbers(value):
    """Every number in a figure (lists walked), booleans left out."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


@pytest.mark.slow
def test_dry_run_writes_every_stage_with_finite_figures(tmp_path):
    pytest.importorskip("transformers")
    results, out = _run(tmp_path)
    assert results["dry_run"] is True
    stages = results["stages"]
    assert list(stages) == STAGES
    for name, res in stages.items():
        assert res["status"] == "ok" or res["status"].startswith("skipped: "), (name, res)
        if res["status"] != "ok":
            assert res["skip_reason"], (name, res)
        assert not res.get("errors"), (name, res["errors"])
        for key, value in res.items():
            assert all(math.isfinite(n) for n in _numbers(value)), (name, key, value)
    has_determinism = (ROOT / "scripts" / "gpu" / "stage_determinism.py").exists()
    assert (stages["determinism"]["status"] == "skipped: not present") != has_determinism

    ceil = stages["ceilings"]
    assert ceil["gemm_best_tflops"] > 0 and ceil["copy_GBps"] > 0
    assert ceil["gemm_vocab_M1k_tflops"] > 0 and ceil["gemm_fc1_wgrad_M1k_tflops"] > 0
    assert ceil["gemm_vocab_aligned_M1k_tflops"] > 0
    # the projected loss with its products on the padded weight: the same loss (bf16 products), both timed
    assert ceil["projected_loss_align1_ms"] > 0 and ceil["projected_loss_align8_ms"] > 0
    assert ceil["projected_loss_aligned_loss_rel_diff"] < 1e-2
    assert ceil["decode_logits_M256_align1_us"] > 0 and ceil["decode_logits_M256_align8_us"] > 0

    att = stages["attention"]
    for kind in ("encoder_self", "decoder_self", "cross"):
        for variant in ("varlen", "sdpa_padded", "flash_equal"):
            key = f"{variant}_{kind}"
            assert att[f"{key}_ms"] > 0 and att[f"{key}_tflops"] > 0, key
            # bf16 against fp32: within bf16's rounding of the largest element
            assert att[f"{key}_out_err"] < 2e-2 and att[f"{key}_grad_err"] < 5e-2, key
            assert isinstance(att[f"{key}_deterministic"], bool)
        assert att[f"cudnn_equal_{kind}_skipped"] == "needs CUDA"

    packed = stages["packed_vs_padded"]
    assert packed["loss_rel_diff"] < 1e-2 and packed["grad_rel_err"] < 5e-2
    assert packed["packed_ms"] > 0 and packed["padded_ms"] > 0

    merged = stages["merged_update"]
    assert merged["batches"] == 4 and merged["passes"] == 1  # (the budget is sized for one pass)
    assert merged["loss_rel_diff"] < 1e-2 and merged["grad_rel_err"] < 5e-2  # bf16: summation order
    assert merged["accumulated_ms"] > 0 and merged["merged_ms"] > 0

    train = stages["train_ab"]
    for label in ("bart_large", "bart_base"):
        for variant in ("accum", "merged", "compiled"):
            key = f"{label}_{variant}"
            assert train[f"{key}_tokens_per_s"] > 0 and train[f"{key}_mfu"] > 0, key
            assert train[f"{key}_peak_gib"] > 0 and train[f"{key}_profile_wall_ms"] > 0, key
            assert train[f"{key}_profile_top"], key
        assert train[f"{label}_accum_passes_per_update"] == 4
        assert train[f"{label}_merged_passes_per_update"] == 1
        assert train[f"{label}_merged_loss0_rel_diff"] < 1e-2
        assert train[f"{label}_compiled_loss0_rel_diff"] < 1e-2
        # one graph per layer class, and a second batch shape compiles nothing new
        assert train[f"{label}_compiled_graph_breaks"] == 0
        assert train[f"{label}_compiled_recompiles_second_shape"] == 0
        assert train[f"{label}_best_variant"] in ("accum", "merged", "compiled")
        assert all((out / f"profile_{label}_{v}.txt").stat().st_size > 0 for v in ("accum", "compiled"))

    hf = stages["transformers"]
    for label in ("bart_large", "bart_base"):
        for setting in ("nocudnn", "shipped"):
            assert hf[f"{label}_{setting}_tokens_per_s"] > 0
        assert hf[f"{label}_compiled_skipped"].startswith("dry run")
        assert hf[f"{label}_step0_loss_rel_diff"] < 1e-2
        assert hf[f"{label}_speedup"] > 0

    gen = stages["generate"]  # gpu_check's stage_generate_static, called as it is
    assert gen["fp32_identical_eager"] == gen["fp32_identical_transformers"] == gen["fp32_sentences"]
    assert gen["bf16_static_sentences_per_s"] > 0
    assert gen["fp32_static_sentences_per_s"] > 0 and gen["fp32_transformers_sentences_per_s"] > 0

    table = (out / "gpu_speed.md").read_text()
    assert all(f"| {name} |" in table for name in STAGES)
    assert "| transformers.bart_large_speedup |" in table and ">= 1.8" in table
    # the fp32 static figure is judged, with its value (not "not measured")
    row = next(r for r in table.splitlines() if r.startswith("| generate.fp32_static_vs_transformers |"))
    assert f"| {gen['fp32_static_vs_transformers']:.4g} | >= 2 |" in row


@pytest.mark.slow
def test_a_spent_budget_skips_the_stages_that_no_longer_fit(tmp_path):
    # every stage but env has a dry-run budget of at least 2 s: with 1 s for the run none of them fits, whatever
    # the machine's speed
    results, out = _run(tmp_path, "--budget", "1", "--stages", "env,ceilings,train_ab,determinism,generate")
    stages = results["stages"]
    assert list(stages) == ["env", "ceilings", "train_ab", "determinism", "generate"]
    assert stages["env"]["status"] in ("ok", "skipped: budget")
    for name in ("ceilings", "train_ab", "determinism", "generate"):
        assert stages[name]["status"] == "skipped: budget", stages[name]
        assert "s of the run left" in stages[name]["skip_reason"]
    assert "skipped: budget" in (out / "gpu_speed.md").read_text()


@pytest.mark.slow
def test_the_watchdog_saves_the_running_stage_and_stops_at_the_deadline(tmp_path):
    out = tmp_path / "out"
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "scripts" / "gpu")!r})
import gpu_speed
def stuck(check):
    check.stage_figures["partial"] = 1.5
    time.sleep(60)
gpu_speed.STAGES[1] = ("ceilings", stuck, 0, 0)  # (a budget of 0 s always fits: the stage starts)
sys.exit(gpu_speed.main(["--dry-run", "--budget", "5", "--stages", "ceilings,attention", "--out", {str(out)!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "gpu_speed.json").read_text())
    assert results["stopped"] == "time budget"
    stuck = results["stages"]["ceilings"]
    assert stuck["status"] == "failed" and "time budget" in stuck["error"] and stuck["partial"] == 1.5
    assert "attention" not in results["stages"]
    assert "| ceilings | failed |" in (out / "gpu_speed.md").read_text()
