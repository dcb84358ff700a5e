"""scripts/gpu/gpu_check.sh --dry-run: every stage of the GPU check runs on the CPU with tiny shapes and writes
its figures to $OUT/gpu_check.json and a table to $OUT/gpu_check.md."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[2])
STAGES = [
    "env",
    "cuda_tests",
    "numerics",
    "sync_count",
    "train_speed",
    "fp16_resume",
    "oom",
    "generate",
    "generate_static",
    "generate_packed",
    "compile",
    "profile",
]


def _numbers(res):
    return {k: v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.slow
def test_dry_run_writes_every_stage_with_numbers(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu", "gpu_check.sh"), "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["dry_run"] is True
    stages = results["stages"]
    assert list(stages) == STAGES
    for name, res in stages.items():
        assert res["status"] in ("ok", "skipped"), (name, res)
        assert res["seconds"] >= 0
        if res["status"] == "skipped":
            assert res["skip_reason"]
    # the stages a CPU can run ran, with their figures
    assert {n for n, r in stages.items() if r["status"] == "skipped"} <= {"oom", "sync_count"}
    for name in ("env", "numerics", "train_speed", "fp16_resume", "generate", "compile", "profile"):
        assert len(_numbers(stages[name])) >= 2, (name, stages[name])
    speed = stages["train_speed"]
    for tk in ("seqtrain", "transformers"):
        # (mfu against a peak measured on a busy CPU is plumbing only: positive, not bounded)
        assert speed[f"bart_tiny_{tk}_tokens_per_s"] > 0 and speed[f"bart_tiny_{tk}_mfu"] > 0
        assert speed[f"bart_tiny_{tk}_peak_mem_gib"] > 0 and speed[f"bart_tiny_{tk}_ms_per_step"] > 0
    assert speed["bart_tiny_step0_loss_rel_diff"] < 1e-2
    num = stages["numerics"]
    assert num["loss_fp16_grad_finite"] and num["loss_bf16_loss_rel_err_vs_full"] < 1e-5
    assert stages["fp16_resume"]["bitwise_equal"] is True
    gen = stages["generate"]
    assert gen["fp32_identical"] == gen["sentences"] and gen["fp32_seqtrain_sentences_per_s"] > 0
    for precision in ("bf16", "bf16_weights"):  # under autocast, and with the weights converted
        assert gen[f"{precision}_seqtrain_sentences_per_s"] > 0 and gen[f"{precision}_speedup"] > 0
    static = stages["generate_static"]  # on the CPU the static path runs without graphs
    assert static["fp32_identical_eager"] == static["fp32_identical_transformers"] == static["fp32_sentences"]
    assert static["bf16_static_sentences_per_s"] > 0 and static["bf16_eager_sentences_per_s"] > 0
    assert static["bf16_transformers_sentences_per_s"] > 0 and static["bf16_static_vs_transformers"] > 0
    assert static["fp32_static_sentences_per_s"] > 0 and static["fp32_transformers_sentences_per_s"] > 0
    assert static["fp32_static_vs_transformers"] == pytest.approx(
        static["fp32_static_sentences_per_s"] / static["fp32_transformers_sentences_per_s"]
    )
    assert static["graphs"] == 0 and static["capture_s"] == 0
    assert 0 <= static["bf16_static_agree_eager"] <= static["sentences"]
    packed = stages["generate_packed"]  # generation's encoder pass packed against padded
    assert packed["fp32_identical"] == packed["fp32_sentences"] > 0
    assert packed["bf16_encoder_packed_ms_per_batch"] > 0 and packed["bf16_encoder_padded_ms_per_batch"] > 0
    assert packed["bf16_encoder_max_abs_diff"] < 0.5 and 0 <= packed["bf16_agree"] <= packed["fp32_sentences"]
    # the check's batches carry the collater's layout, so the compiled step is one graph: no sync breaks it
    assert stages["compile"]["graph_breaks"] == 0, stages["compile"]["graph_break_reasons"]
    assert stages["compile"]["compiled_ms_per_step"] > 0
    assert stages["cuda_tests"]["failed"] == 0 and stages["cuda_tests"]["errors"] == 0
    for tk in ("seqtrain", "transformers"):  # the host's side of the profiled steps, heaviest first
        assert stages["profile"][f"{tk}_host_top"] and (out / f"profile_{tk}_host.txt").stat().st_size > 0
    table = (out / "gpu_check.md").read_text()
    assert all(f"| {name} |" in table for name in STAGES)


DETERMINISM_DRY_RUN = """
import argparse, json, sys
sys.path.insert(0, "scripts/gpu")
import gpu_check
from stage_determinism import stage_determinism
check = gpu_check.Check(argparse.Namespace(dry_run=True, out=sys.argv[1], peak_flops=1e12))
print(json.dumps(stage_determinism(check)))
"""


def test_determinism_stage_dry_run(tmp_path):
    """scripts/gpu/stage_determinism.py on the CPU with tiny shapes, as gpu_check.py would run it: two runs and a
    resume bitwise equal under --deterministic, the three timings positive, nothing left in $OUT."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", DETERMINISM_DRY_RUN, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["arch"] == "bart_tiny" and res["updates"] == 4 and res["resumed_at"] == 2
    assert res["bitwise_two_runs"] is True and res["bitwise_resume"] is True
    assert res["max_param_diff_two_runs"] == res["max_param_diff_resume"] == 0.0
    assert res["num_updates_resumed"] == 4 and res["varlen_kernel"] is False  # the CPU: the reference
    assert res["cublas_workspace_config"] == ":4096:8"  # exported by the flag (no CUDA started yet)
    for key in ("deterministic_ms_per_step", "deterministic_nofill_ms_per_step", "default_ms_per_step"):
        assert res[key] > 0, key
    assert res["tokens_per_step"] > 0 and res["loss_rel_diff_vs_default"] < 1e-2
    assert os.listdir(tmp_path) == []  # the resume checkpoint was removed
