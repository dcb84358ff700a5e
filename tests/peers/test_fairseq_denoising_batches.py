"""`--task denoising` batches against fairseq 0.12's own denoising task on the same data-bin and flags (the
`fairseq` marker; skipped when fairseq's venv is absent): the same blocks (each example's target tensor), the
same recorded sizes, the same frozen batches and their order in epochs 1 and 2.

fairseq's side builds its task from fairseq-train's own parser and asks it for the iterator the way
fairseq's Trainer.get_train_iterator does (its max positions, --max-tokens, ignore_invalid_inputs, the
required batch size multiple, --seed, the epoch). The noise is not compared here: fairseq draws it from
torch's global generator, seqtrain per example (tests/peers/test_fairseq_denoising.py compares the functions).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from seqtrain.flags import training
from seqtrain.tasks import setup_task
from seqtrain.train.program import train_config
from tests.utils import SAMPLE

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "fairseq-train").exists(),
        reason=f"fairseq 0.12 not installed at {VENV} (set FAIRSEQ_VENV, or run ../shared/tools/fairseq-peer.sh)",
    ),
]

FAIRSEQ_SIDE = r"""
import json, sys
from fairseq import options, tasks, utils

out = {}
for name, argv in json.load(sys.stdin).items():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv + ["--arch", "bart_base"])
    task = tasks.setup_task(args)
    task.load_dataset("train", epoch=1)
    ds = task.dataset("train")
    itr = task.get_batch_iterator(
        dataset=ds, max_tokens=args.max_tokens, max_sentences=args.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), (1024, 1024), args.max_tokens),
        ignore_invalid_inputs=True, required_batch_size_multiple=args.required_batch_size_multiple,
        seed=args.seed, num_shards=1, shard_id=0, num_workers=0, epoch=1)
    epochs = []
    for epoch in (1, 2):
        e = itr.next_epoch_itr(shuffle=True)
        epochs.append([b["id"].tolist() for b in e])
    out[name] = {
        "len_dict": len(task.source_dictionary),
        "sizes": [int(s) for s in ds.sizes],
        "targets": [ds[i]["target"].tolist() for i in range(len(ds))],
        "epochs": epochs,
    }
json.dump(out, sys.stdout)
"""

CASES = {
    "complete_doc 128": ["--tokens-per-sample", "128"],
    "complete 64, shuffle-instance": ["--tokens-per-sample", "64", "--sample-break-mode", "complete"]
    + ["--shuffle-instance", "1"],
    "eos, batch-size 5, seed 3": ["--sample-break-mode", "eos", "--batch-size", "5", "--seed", "3"],
    "none 100": ["--tokens-per-sample", "100", "--sample-break-mode", "none", "--max-tokens", "700"],
}


@pytest.fixture(scope="module")
def mono(tmp_path_factory) -> pathlib.Path:
    from seqtrain_cli.preprocess import preprocess_main

    root = tmp_path_factory.mktemp("mono")
    lines = (SAMPLE / "train.source").read_text(encoding="utf-8").splitlines(keepends=True)[:300]
    (root / "train.txt").write_text("".join(lines), encoding="utf-8")
    dest = root / "bin"
    preprocess_main(["--only-source", "--trainpref", str(root / "train.txt"), "--destdir", str(dest)]
                    + ["--spm-vocab-size", "400", "--no-progress-bar"])  # fmt: skip
    return dest


def test_blocks_and_batches_equal_fairseqs(mono):
    argvs = {
        name: [str(mono), "--task", "denoising", "--max-tokens", "2048", "--mask", "0.3", *extra]
        for name, extra in CASES.items()
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", FAIRSEQ_SIDE],
        input=json.dumps({n: a for n, a in argvs.items()}),
        capture_output=True,
        text=True,
        env=dict(env, OMP_NUM_THREADS="1", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout)
    for name, argv in argvs.items():
        args = training.parse_train_args([*argv, "--arch", "bart_tiny", "--cpu"])
        task = setup_task(train_config(args).task)
        ds = task.load_dataset("train")
        itr = task.get_batch_iterator(
            ds,
            max_tokens=args.max_tokens,
            max_sentences=args.batch_size,
            max_positions=(1024, 1024),
            ignore_invalid_inputs=True,
            required_batch_size_multiple=args.required_batch_size_multiple,
            seed=args.seed,
            epoch=1,
        )
        t = theirs[name]
        assert len(task.dictionary) == t["len_dict"], name
        assert ds.sizes.tolist() == t["sizes"], name
        assert [ds[i]["target"].tolist() for i in range(len(ds))] == t["targets"], name
        for epoch, batches in zip((1, 2), t["epochs"]):
            ours = [sorted(b.tolist()) for b in itr.epoch_batches(epoch)]
            assert ours == [sorted(b) for b in batches], f"{name}: epoch {epoch}"
        assert len(t["epochs"][0]) > 3 and t["epochs"][0] != t["epochs"][1], name
