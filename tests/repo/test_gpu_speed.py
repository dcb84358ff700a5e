"""scripts/gpu/gpu_speed.sh --dry-run: every stage of the prepared GPU speed run runs on the CPU with tiny shapes
(or is skipped with its reason) and writes its figures to $OUT/gpu_speed.json and a table to $OUT/gpu_speed.md;
the fair stages (issue 49) alternate their engines in rotated rounds and report medians and spreads of the
samples, the fastest engine of each toolkit and the speedup between them; a run whose budget is spent skips
the stages that no longer fit."""

import json
import math
import os
import pathlib
import statistics
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = [
    "env",
    "ceilings",
    "align",
    "attention",
    "packed_vs_padded",
    "merged_update",
    "train_ab",
    "determinism",
    "train_fair_large",
    "generate_fair",
    "train_fair_base",
    "attention_lever",
    "serve",
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


def _alternated(res, p, unit, scale):
    """The fair stage's engines (prefix `p`): rotated rounds, each engine a sample a round, the summary figures
    computed from the samples, each toolkit's best the least median, the speedup their medians' ratio."""
    engines, order, rounds = res[f"{p}engines"], res[f"{p}order"], res[f"{p}rounds"]
    n = len(engines)
    assert len(order) == rounds >= 3
    for r, names in enumerate(order):
        assert names == engines[r % n :] + engines[: r % n], (r, names)
    medians = {}
    for e in engines:
        xs = res[f"{p}{e}_samples_s"]
        assert len(xs) == res[f"{p}{e}_samples"] == rounds and all(x > 0 for x in xs), e
        medians[e] = statistics.median(xs)
        assert res[f"{p}{e}_{unit}_median"] == pytest.approx(medians[e] * scale)
        assert res[f"{p}{e}_{unit}_min"] == pytest.approx(min(xs) * scale)
        assert res[f"{p}{e}_{unit}_max"] == pytest.approx(max(xs) * scale)
        assert res[f"{p}{e}_{unit}_min"] <= res[f"{p}{e}_{unit}_q1"] <= res[f"{p}{e}_{unit}_median"]
        assert res[f"{p}{e}_{unit}_median"] <= res[f"{p}{e}_{unit}_q3"] <= res[f"{p}{e}_{unit}_max"]
        assert isinstance(res[f"{p}{e}_cudnn_sdp"], bool) and res[f"{p}{e}_prepare_s"] > 0
    best = {}
    for toolkit, prefix in (("seqtrain", "seqtrain"), ("transformers", "hf_")):
        ran = [e for e in engines if e.startswith(prefix)]
        best[toolkit] = min(ran, key=lambda e: medians[e])
        assert res[f"{p}{toolkit}_best"] == best[toolkit]
    assert res[f"{p}speedup"] == pytest.approx(medians[best["transformers"]] / medians[best["seqtrain"]])
    assert res[f"{p}speedup_rounds_min"] <= res[f"{p}speedup_rounds_median"] <= res[f"{p}speedup_rounds_max"]
    return engines


def _check_train_fair(fair, p):
    """A dry run's train_fair stage (prefix `p`): its engines alternated, the skipped ones named, the same
    losses, nothing recompiled."""
    engines = _alternated(fair, p, "ms", 1000.0)
    # the dry run's engines; transformers' compiled ones and flex are skipped with their reasons
    assert engines == ["seqtrain_compiled", "hf_eager", "hf_eager_cudnn", "seqtrain_eager"]
    for name in ("hf_compiled", "hf_compiled_cudnn", "hf_flex"):
        assert fair[f"{p}{name}_skipped"].startswith("dry run"), name
    assert fair[f"{p}hf_eager_cudnn_cudnn_sdp"] is True and fair[f"{p}hf_eager_cudnn_sdp"] is False
    assert fair[f"{p}seqtrain_compiled_cudnn_sdp"] is False
    assert fair[f"{p}hf_eager_layout"].startswith("one pass")  # transformers in one pass, as seqtrain
    assert fair[f"{p}seqtrain_compiled_passes_per_update"] == 1
    for e in engines:
        assert fair[f"{p}{e}_tokens_per_s"] > 0 and fair[f"{p}{e}_mfu"] > 0, e
    assert fair[f"{p}best_mfu"] == fair[f"{p}{fair[f'{p}seqtrain_best']}_mfu"]
    # the same first update on the same weights: the same loss; the compiled step at a second shape
    # compiles nothing new; no engine recompiled in the rounds
    assert fair[f"{p}step0_loss_rel_diff"] < 1e-2 and fair[f"{p}seqtrain_eager_loss0_rel_diff"] < 1e-2
    assert fair[f"{p}recompiles_second_shape"] == 0 and fair[f"{p}graphs_compiled_in_rounds"] == 0
    assert fair[f"{p}seqtrain_compiled_graph_breaks"] == 0 and fair[f"{p}seqtrain_compiled_graphs"] > 0
    assert fair[f"{p}profile_top"] and fair[f"{p}rounds"] == fair[f"{p}rounds_target"]


def _check_generate_fair(gen):
    """A dry run's generate_fair: both precisions' engines alternated; fp32's hypotheses all identical."""
    for precision in ("bf16", "fp32"):
        engines = _alternated(gen, f"{precision}_", "s", 1.0)
        assert (
            engines[:3] == ["seqtrain_static", "hf_dynamic", "hf_static"] and engines[-1] == "seqtrain_eager"
        )
        assert gen[f"{precision}_hf_compiled_static_skipped"].startswith("dry run")
        for e in engines:
            median = statistics.median(gen[f"{precision}_{e}_samples_s"])
            assert gen[f"{precision}_{e}_sentences_per_s"] == pytest.approx(gen["sentences"] / median)
            assert gen[f"{precision}_{e}_warmup_s"] and len(gen[f"{precision}_{e}_warmup_s"]) == 1
    assert gen["bf16_hf_static_cudnn_cudnn_sdp"] is True and gen["bf16_hf_static_cudnn_sdp"] is False
    assert gen["fp32_hf_static_cudnn_skipped"] == "cuDNN attention is half precision only"
    # fp32: every best hypothesis as transformers' (default and static cache) and the eager loop's
    n = gen["sentences"]
    assert gen["fp32_identical_transformers"] == gen["fp32_hf_dynamic_identical"] == n
    assert gen["fp32_hf_static_identical"] == gen["fp32_seqtrain_eager_identical"] == n
    assert gen["fp32_identical_share"] == 1.0


def _check_lever_and_serve(stages):
    """A dry run's attention lever (cuDNN needs CUDA; FA3/FA4 say why they are out) and serve (skipped)."""
    lever = stages["attention_lever"]
    for width in lever["widths"]:
        for variant in ("varlen", "sdpa_padded", "flash_equal"):
            key = f"{variant}_w{width}"
            assert lever[f"{key}_ms"] > 0 and lever[f"{key}_first_ms"] > 0, key
            assert lever[f"{key}_out_err"] < 2e-2 and lever[f"{key}_grad_err"] < 5e-2, key
    assert lever["cudnn_skipped"] == "needs CUDA"
    for impl in lever["flash_impls"] if isinstance(lever["flash_impls"], list) else []:
        assert lever[f"{impl}_activation"], impl  # "ok", or why not (its module is not in this image)

    serve = stages["serve"]
    has_serve = (ROOT / "scripts" / "bench" / "bench_serve.py").exists()
    assert serve["status"] == ("skipped: dry run" if has_serve else "skipped: not present")
    if has_serve:
        assert serve["help_rc"] == 0


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
    for name, res in stages.items():  # the cuDNN attention switch as each stage found it
        assert isinstance(res["cudnn_sdp_at_start"], bool), name
    env = stages["env"]
    assert isinstance(env["cudnn_sdp_default"], bool) and env["transformers"]
    assert isinstance(env["bart_supports_flex_attn"], bool) and "flash_attention_impls" in env

    align = stages["align"]  # the dry run's odd vocabulary, 1001: 1 and 8 differ, 64 and 128 coincide
    assert [align[f"align{a}_width"] for a in (1, 8, 64, 128)] == [1001, 1008, 1024, 1024]
    for a in (1, 8, 64, 128):
        for fig in ("gemm_fwd_tflops", "gemm_dgrad_tflops", "gemm_wgrad_tflops", "projected_loss_ms"):
            assert align[f"align{a}_{fig}"] > 0, (a, fig)
        assert align[f"align{a}_decode_logits_us"] > 0
        # the products on the padded weight: the same loss
        assert align[f"align{a}_loss_rel_diff"] < 1e-2
    assert (
        align["align64_projected_loss_ms"] == align["align128_projected_loss_ms"]
    )  # (one width, timed once)
    best = min((1, 8, 64, 128), key=lambda a: (align[f"align{a}_projected_loss_ms"], a))
    assert align["projected_loss_best_align"] == best
    assert align["align8_projected_loss_vs_align8"] == 1.0

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
    # (a dry run's bart_base would be bart_large's run again: both are bart_tiny)
    assert train["bart_base_skipped"].startswith("dry run")
    for label in ("bart_large",):
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

    assert stages["train_fair_base"]["status"] == "skipped: dry run"  # (as train_ab's bart_base)
    _check_train_fair(stages["train_fair_large"], "bart_large_")
    gen = stages["generate_fair"]
    _check_generate_fair(gen)
    _check_lever_and_serve(stages)

    table = (out / "gpu_speed.md").read_text()
    assert all(f"| {name} |" in table for name in STAGES)
    # one table per fair comparison: a row per engine with its median and spread, the ones left out named
    for head, engines in (
        ("## train_fair_large, bart_large: 4 rounds;", stages["train_fair_large"]["bart_large_engines"]),
        ("## generate_fair, fp32: 3 rounds;", gen["fp32_engines"]),
    ):
        part = table[table.index(head) :]
        assert all(f"| {e} | " in part for e in engines)
    assert "- left out: hf_flex: dry run" in table
    row = next(r for r in table.splitlines() if r.startswith("| train_fair_large.bart_large_speedup |"))
    assert f"| {stages['train_fair_large']['bart_large_speedup']:.4g} | >= 1.8 |" in row
    # the fp32 beam search figure is judged, with its value (not "not measured")
    row = next(r for r in table.splitlines() if r.startswith("| generate_fair.fp32_speedup |"))
    assert f"| {gen['fp32_speedup']:.4g} | >= 2 |" in row


@pytest.mark.slow
def test_a_spent_budget_skips_the_stages_that_no_longer_fit(tmp_path):
    # every stage but env has a dry-run budget of at least 2 s: with 1 s for the run none of them fits, whatever
    # the machine's speed
    results, out = _run(
        tmp_path, "--budget", "1", "--stages", "env,ceilings,train_ab,determinism,generate_fair"
    )
    stages = results["stages"]
    assert list(stages) == ["env", "ceilings", "train_ab", "determinism", "generate_fair"]
    assert stages["env"]["status"] in ("ok", "skipped: budget")
    for name in ("ceilings", "train_ab", "determinism", "generate_fair"):
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
