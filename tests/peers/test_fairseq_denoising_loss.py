"""`--task denoising` against `fairseq-train --task denoising` from the same weights (the `fairseq` marker;
skipped when fairseq's venv is absent): through both command lines, from an exported checkpoint, with dropout 0
and lr 0, one epoch's mean training loss and the validation loss agree within 1 %.

The weights: a 2+2-layer, 64-dimension BART that seqtrain pretrains 150 updates on 600 descriptions of the
sample (sentencepiece, 500 pieces), exported with `seqtrain-convert --to fairseq`; fairseq restores it into its
own denoising task (its dictionary plus `<mask>`: the same 505 rows) through ../shared/tools/fairseq-train-spm.py,
which hands its whole-word mask the sentencepiece model. The noise is BART's (span-poisson 3.5, 30 % masked, 10 %
random, --replace-length 1, rotation) without sentence permutation, which the tools define differently here.

What this does not show: a model this short-trained predicts its targets without using its source (its loss is
the same at --mask 0 and 0.9, measured), so the agreement checks the exported model, the blocks and the batches
end to end, not the noise; the noise is compared function by function in tests/peers/test_fairseq_denoising.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.utils import REPO, SAMPLE

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
SPM_TRAIN = REPO.parent / "shared" / "tools" / "fairseq-train-spm.py"
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "fairseq-train").exists() or not SPM_TRAIN.exists(),
        reason=f"fairseq 0.12 not installed at {VENV} or {SPM_TRAIN} missing (../shared/tools/fairseq-peer.sh)",
    ),
]

MODEL = ["--arch", "bart_base", "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64"]
MODEL += ["--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128"]
MODEL += ["--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
MODEL += ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
NOISE = ["--task", "denoising", "--tokens-per-sample", "256", "--mask", "0.3", "--mask-random", "0.1"]
NOISE += [
    "--mask-length",
    "span-poisson",
    "--poisson-lambda",
    "3.5",
    "--replace-length",
    "1",
    "--rotate",
    "0.5",
]
COMMON = [*MODEL, *NOISE, "--criterion", "cross_entropy", "--optimizer", "adam", "--max-tokens", "2048"]
COMMON += ["--seed", "1", "--cpu", "--log-format", "json", "--log-interval", "1000"]


def run(cmd: list, env: dict) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def losses(log: str) -> tuple[float, float]:
    """(train_loss, valid_loss) of the last epoch lines of a json-format log (either tool)."""
    found: dict = {}
    for line in log.splitlines():
        if "{" in line and ('"train_loss"' in line or '"valid_loss"' in line):
            found.update(json.loads(line[line.index("{") :]))
    return float(found["train_loss"]), float(found["valid_loss"])


def test_loss_from_the_same_exported_weights_matches_fairseq(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    seqtrain = [sys.executable, "-m"]
    for split, lines in (("train", slice(0, 600)), ("valid", slice(600, 700))):
        text = (SAMPLE / "train.source").read_text(encoding="utf-8").splitlines(keepends=True)[lines]
        (tmp_path / f"{split}.txt").write_text("".join(text), encoding="utf-8")
    data = tmp_path / "bin"
    run([*seqtrain, "seqtrain_cli.preprocess", "--only-source", "--trainpref", tmp_path / "train.txt"]
        + ["--validpref", tmp_path / "valid.txt", "--destdir", data, "--spm-vocab-size", "500"]
        + ["--no-progress-bar"], env)  # fmt: skip
    init = tmp_path / "init"
    pretrain = [
        "--lr",
        "2e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "50",
        "--max-update",
        "150",
    ]
    run(
        [
            *seqtrain,
            "seqtrain_cli.train",
            data,
            *COMMON,
            *pretrain,
            "--save-dir",
            init,
            "--no-epoch-checkpoints",
        ],
        env,
    )
    run([*seqtrain, "seqtrain_cli.convert", init / "checkpoint_last.pt", tmp_path / "fs" / "model.pt"]
        + ["--to", "fairseq"], env)  # fmt: skip

    eval_flags = ["--lr", "0", "--max-epoch", "1"]
    start = ["--finetune-from-model", init / "checkpoint_last.pt", "--save-dir", tmp_path / "ours"]
    ours = run([*seqtrain, "seqtrain_cli.train", data, *COMMON, *eval_flags, "--no-save", *start], env)
    fs_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    fs_env.update(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", SPM_MODEL=str(data / "spm.model"))
    theirs = run([VENV / "bin" / "python", SPM_TRAIN, data, *COMMON, *eval_flags, "--no-save"]
                 + ["--bpe", "sentencepiece", "--sentencepiece-model", data / "spm.model", "--num-workers", "0"]
                 + ["--restore-file", tmp_path / "fs" / "model.pt", "--reset-optimizer", "--reset-dataloader"]
                 + ["--reset-meters", "--reset-lr-scheduler", "--save-dir", tmp_path / "theirs"], fs_env)  # fmt: skip

    (ours_train, ours_valid), (fs_train, fs_valid) = losses(ours), losses(theirs)
    assert abs(ours_train - fs_train) < 0.01 * fs_train, (ours_train, fs_train)
    assert abs(ours_valid - fs_valid) < 0.01 * fs_valid, (ours_valid, fs_valid)
    assert fs_train < 8.0  # learned something: log2(505) = 8.98 is the loss of a uniform guess
