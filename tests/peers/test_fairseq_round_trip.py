"""With fairseq 0.12 itself (the `fairseq` marker; skipped when its venv is absent): fairseq loads seqtrain's
exports and generates what seqtrain-generate does, and both train alike from the same weights.

The venv is $FAIRSEQ_VENV, else ~/.cache/seqtrain-peers/fairseq (../shared/tools/fairseq-peer.sh installs it).
The models: bart_tiny-sized, post-norm and pre-norm, trained a few updates by seqtrain on a slice of the bundled
debdesc sample (sources cut at 128 pieces), exported with `seqtrain-convert --to fairseq`.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.utils import SAMPLE

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "fairseq-generate").exists(),
        reason=f"fairseq 0.12 not installed at {VENV} (set FAIRSEQ_VENV, or run ../shared/tools/fairseq-peer.sh)",
    ),
]
# flags both tools take with the same meaning, for the tiny models below
MODEL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64", "--decoder-embed-dim"]
MODEL += [
    "64",
    "--encoder-ffn-embed-dim",
    "128",
    "--decoder-ffn-embed-dim",
    "128",
    "--encoder-attention-heads",
]
MODEL += ["4", "--decoder-attention-heads", "4", "--max-source-positions", "128", "--truncate-source"]
GENERATE = ["--gen-subset", "valid", "--beam", "4", "--batch-size", "8", "--max-len-b", "12", "--cpu"]
GENERATE += ["--truncate-source", "--max-source-positions", "128"]


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1")
    if str(cmd[0]).startswith(str(VENV)):
        env.pop("PYTHONPATH", None)  # fairseq's venv must not import seqtrain's tree
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kw)
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stderr[-3000:]}"
    return proc


def seqtrain_cli(name: str) -> list[str]:
    return [sys.executable, "-c", f"from seqtrain_cli.{name} import cli_main; cli_main()"]


@pytest.fixture(scope="module")
def sample_bin(tmp_path_factory) -> pathlib.Path:
    """A data-bin of the sample's first 600 training and 24 validation pairs (sentencepiece, 400 pieces)."""
    from seqtrain_cli.preprocess import preprocess_main

    root = tmp_path_factory.mktemp("sample")
    for split, n in (("train", 600), ("valid", 24)):
        for side in ("source", "target"):
            lines = (SAMPLE / f"{split}.{side}").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
            (root / f"{split}.{side}").write_text("".join(lines), encoding="utf-8")
    dest = root / "bin"
    preprocess_main(
        ["--trainpref", str(root / "train"), "--validpref", str(root / "valid"), "--destdir", str(dest)]
        + ["--joined-dictionary", "--spm-vocab-size", "400", "--no-progress-bar"]
    )
    return dest


@pytest.fixture(scope="module", params=["post-norm", "pre-norm"])
def export(request, sample_bin, tmp_path_factory) -> pathlib.Path:
    """seqtrain trains the model 6 updates, then exports it: the fairseq model.pt (dict.txt next to it)."""
    from seqtrain_cli.convert import main as convert_main
    from seqtrain_cli.train import train_main

    folder = tmp_path_factory.mktemp(request.param)
    norm = ["--encoder-normalize-before", "--decoder-normalize-before"] if request.param == "pre-norm" else []
    argv = [
        str(sample_bin),
        "--arch",
        "bart_base",
        *MODEL,
        *norm,
        "--cpu",
        "--max-tokens",
        "2048",
        "--lr",
        "5e-3",
    ]
    argv += ["--max-update", "6", "--save-dir", str(folder), "--disable-validation", "--log-format", "none"]
    train_main(argv + ["--no-epoch-checkpoints"])
    out = folder / "fairseq" / "model.pt"
    convert_main([str(folder / "checkpoint_last.pt"), str(out), "--to", "fairseq"])
    return out


def parse_generate(text: str) -> dict:
    """{id: {"S": text, "T": text, "H": (score, text), "P": [scores]}} from fairseq-generate's output lines."""
    out: dict = {}
    for line in text.splitlines():
        m = re.match(r"^([STHP])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
        entry = out.setdefault(sid, {})
        if kind == "H":
            score, _, hyp = rest.partition("\t")
            entry["H"] = (float(score), hyp)
        elif kind == "P":
            entry["P"] = [float(x) for x in rest.split()]
        else:
            entry[kind] = rest
    return out


def assert_same_generation(fairseq_out: dict, seqtrain_out: dict) -> None:
    assert sorted(fairseq_out) == sorted(seqtrain_out) and fairseq_out
    for sid, f in fairseq_out.items():
        s = seqtrain_out[sid]
        assert (s["S"], s["T"], s["H"][1]) == (f["S"], f["T"], f["H"][1]), sid
        assert s["H"][0] == pytest.approx(f["H"][0], abs=1e-4), sid  # fairseq's float32 vs printed repr
        assert s["P"] == pytest.approx(f["P"], abs=2e-4), sid  # P- scores are printed to 4 decimals


def test_fairseq_generate_on_export_matches_seqtrain(export, sample_bin):
    """fairseq-generate loads the export and prints the hypotheses and scores seqtrain-generate prints."""
    fq = run([VENV / "bin" / "fairseq-generate", sample_bin, "--path", export, *GENERATE]).stdout
    st = run(seqtrain_cli("generate") + [str(sample_bin), "--path", str(export), *GENERATE]).stdout
    fairseq_out, seqtrain_out = parse_generate(fq), parse_generate(st)
    assert len(fairseq_out) == 24
    assert_same_generation(fairseq_out, seqtrain_out)


def test_fairseq_checkpoint_round_trip_generates_as_fairseq(fairseq_tiny, tmp_path):
    """fairseq's own checkpoint -> seqtrain-convert --to fairseq -> fairseq-generate: line for line what
    fairseq-generate prints for its own checkpoint on this machine (same hypotheses, same scores to the last
    digit), and the fixture's log within float rounding (it was written on another CPU, whose kernels round
    the last bits of the scores differently: fairseq itself does not reproduce it bit for bit here)."""
    from seqtrain_cli.convert import main as convert_main

    out = tmp_path / "model.pt"
    convert_main(
        [
            str(fairseq_tiny / "checkpoint_last.pt"),
            str(out),
            "--to",
            "fairseq",
            "--dict",
            str(fairseq_tiny / "data-bin"),
        ]
    )
    cmd = [VENV / "bin" / "fairseq-generate", fairseq_tiny / "data-bin", "--task", "translation"]
    cmd += [
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--gen-subset",
        "valid",
        "--path",
        out,
        "--beam",
        "4",
    ]
    got = parse_generate(run(cmd + ["--batch-size", "64", "--cpu"]).stdout)
    cmd[cmd.index(out)] = fairseq_tiny / "checkpoint_last.pt"
    own = parse_generate(run(cmd + ["--batch-size", "64", "--cpu"]).stdout)
    assert len(own) == 200 and got == own
    want = parse_generate((fairseq_tiny / "generate_beam4_valid.log").read_text(encoding="utf-8"))
    assert len(want) == 200
    assert_same_generation(want, got)


def train_log(text: str) -> list[dict]:
    """The train_inner records of a --log-format json log (fairseq's or seqtrain's)."""
    records = []
    for line in text.splitlines():
        start = line.find("{")
        if start >= 0 and "train_inner" in line:
            records.append(json.loads(line[start:]))
    return records


@pytest.mark.parametrize("export", ["post-norm"], indirect=True)
def test_same_training_from_same_weights(export, sample_bin, tmp_path):
    """Both tools fine-tune the same export with the same flags and dropout 0: the same batches (size, tokens)
    and the same loss, update for update."""
    flags = [str(sample_bin), "--arch", "bart_base", *MODEL, "--finetune-from-model", str(export), "--cpu"]
    flags += ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
    flags += [
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--optimizer",
        "adam",
    ]
    flags += ["--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt"]
    flags += ["--warmup-updates", "4", "--max-tokens", "1024", "--required-batch-size-multiple", "1"]
    flags += ["--seed", "1", "--max-update", "12", "--log-format", "json", "--log-interval", "1"]
    flags += ["--disable-validation", "--no-save", "--num-workers", "0"]
    fq = run([VENV / "bin" / "fairseq-train", *flags, "--save-dir", tmp_path / "fq"])
    st = run(seqtrain_cli("train") + flags + ["--save-dir", str(tmp_path / "st")])
    fq_log, st_log = train_log(fq.stdout + fq.stderr), train_log(st.stdout + st.stderr)
    assert len(fq_log) == len(st_log) == 12
    for f, s in zip(fq_log, st_log):
        assert (float(s["bsz"]), float(s["wpb"])) == (float(f["bsz"]), float(f["wpb"])), f["num_updates"]
        assert float(s["loss"]) == pytest.approx(float(f["loss"]), rel=1e-3), f["num_updates"]


FAIRSEQ_BATCHES = r"""
import json, sys
from fairseq import options, tasks
argv = [sys.argv[1], "--task", "translation", "--source-lang", "source", "--target-lang", "target", "--arch",
        "bart_base", "--max-tokens", "900", "--seed", "1", "--truncate-source", "--max-source-positions", "128"]
args = options.parse_args_and_arch(options.get_training_parser(), argv)
task = tasks.setup_task(args)
task.load_dataset("train", epoch=1)
itr = task.get_batch_iterator(task.dataset("train"), max_tokens=900, max_positions=(128, 1024),
    ignore_invalid_inputs=True, required_batch_size_multiple=8, seed=1, epoch=1)
frozen = [b.tolist() for b in itr.frozen_batches]
epoch = [b["id"].tolist() for b in itr.next_epoch_itr(shuffle=True)]
print(json.dumps({"frozen": frozen, "epoch1": epoch}))
"""


def test_training_batches_with_the_default_multiple_of_8_are_fairseqs(sample_bin, tmp_path):
    """fairseq's own get_batch_iterator on the same data-bin (the default --required-batch-size-multiple 8,
    which the batch-list fixtures, made with 1, do not cover): the same frozen batches and epoch-1 order."""
    from seqtrain.flags.training import parse_train_args
    from seqtrain.tasks import setup_task
    from seqtrain.train.program import train_config

    script = tmp_path / "fairseq_batches.py"
    script.write_text(FAIRSEQ_BATCHES)
    want = json.loads(run([VENV / "bin" / "python", script, sample_bin]).stdout.strip().splitlines()[-1])
    argv = [
        str(sample_bin),
        "--arch",
        "bart_base",
        "--max-tokens",
        "900",
        "--seed",
        "1",
        "--truncate-source",
    ]
    args = parse_train_args(argv + ["--max-source-positions", "128", "--cpu"])
    task = setup_task(train_config(args).task)
    itr = task.get_batch_iterator(
        task.load_dataset("train"),
        max_tokens=900,
        max_positions=(128, 1024),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=8,
        seed=1,
        epoch=1,
        split="train",
    )
    assert [b.tolist() for b in itr.frozen_batches] == want["frozen"]
    assert [sorted(b.tolist()) for b in itr.epoch_batches(1)] == [sorted(b) for b in want["epoch1"]]
