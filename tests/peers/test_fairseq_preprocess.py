"""`seqtrain-preprocess --only-source` against `fairseq-preprocess --only-source` itself (the `fairseq` marker;
skipped when fairseq 0.12's venv is absent): the same monolingual text and flags give byte-identical files of the
same names: dict.txt (or dict.X.txt), {split}.bin/.idx (or {split}.X-None.X.bin/.idx with -s X).

The venv is $FAIRSEQ_VENV, else ~/.cache/seqtrain-peers/fairseq (../shared/tools/fairseq-peer.sh installs it).
The text: descriptions of the bundled debdesc sample, already split on whitespace (fairseq-preprocess has no
tokenizer; seqtrain's `--tokenizer none`).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.utils import SAMPLE

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "fairseq-preprocess").exists(),
        reason=f"fairseq 0.12 not installed at {VENV} (set FAIRSEQ_VENV, or run ../shared/tools/fairseq-peer.sh)",
    ),
]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1")
    if str(cmd[0]).startswith(str(VENV)):
        env.pop("PYTHONPATH", None)  # fairseq's venv must not import seqtrain's tree
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stderr[-3000:]}"
    return proc


def files(folder: pathlib.Path) -> dict[str, bytes]:
    """The data files fairseq writes (its preprocess.log and seqtrain's tokenizer / summary files aside)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".bin", ".idx", ".txt")}


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> pathlib.Path:
    """train (1,000 lines) and valid (100) of the sample's descriptions, unsuffixed and as PREFIX.mono; and
    in docs/, the same with a blank line (a document break) after every 5th line."""
    root = tmp_path_factory.mktemp("mono")
    (root / "docs").mkdir()
    for split, n in (("train", 1000), ("valid", 100)):
        lines = (SAMPLE / f"{split}.source").read_text(encoding="utf-8").splitlines()[:n]
        body = "".join(" ".join(line.split()) + "\n" for line in lines)
        (root / split).write_text(body, encoding="utf-8")
        (root / f"{split}.mono").write_text(body, encoding="utf-8")
        docs = "".join(" ".join(x.split()) + "\n" + ("\n" if i % 5 == 4 else "") for i, x in enumerate(lines))
        (root / "docs" / split).write_text(docs, encoding="utf-8")
    return root


CASES = {
    "built dictionary": [],
    "workers 2, threshold, padding": ["--workers", "2", "--thresholdsrc", "2", "--padding-factor", "16"],
    "nwords": ["--nwordssrc", "300"],
    "given dictionary": ["--srcdict", "SRCDICT"],
    "-s names the side": ["-s", "mono"],
    "blank lines end documents": ["DOCS"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_only_source_is_byte_identical_to_fairseq(case, text, tmp_path):
    extra = CASES[case]
    if "SRCDICT" in extra:  # a dictionary of another text (the sample's targets), as BART's dict.txt is
        srcdict = tmp_path / "given.txt"
        lines = (SAMPLE / "train.target").read_text(encoding="utf-8").splitlines()[:500]
        (tmp_path / "t").write_text("".join(" ".join(x.split()) + "\n" for x in lines), encoding="utf-8")
        run([VENV / "bin/fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "t"]
            + ["--destdir", tmp_path / "d", "--dict-only"])  # fmt: skip
        srcdict.write_bytes((tmp_path / "d" / "dict.txt").read_bytes())
        extra = [str(srcdict) if a == "SRCDICT" else a for a in extra]
    folder = text / "docs" if "DOCS" in extra else text
    extra = [a for a in extra if a != "DOCS"]
    common = ["--only-source", "--trainpref", folder / "train", "--validpref", folder / "valid", *extra]
    fairseq_out, seqtrain_out = tmp_path / "fairseq", tmp_path / "seqtrain"
    run([VENV / "bin/fairseq-preprocess", *common, "--destdir", fairseq_out])
    run([sys.executable, "-m", "seqtrain_cli.preprocess", *common, "--destdir", seqtrain_out]
        + ["--tokenizer", "none", "--no-progress-bar"])  # fmt: skip

    theirs, ours = files(fairseq_out), files(seqtrain_out)
    if "-s" in extra:
        names = ["dict.mono.txt", "train.mono-None.mono.bin", "train.mono-None.mono.idx"]
        names += ["valid.mono-None.mono.bin", "valid.mono-None.mono.idx"]
    else:
        names = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]
    assert sorted(theirs) == names
    assert sorted(ours) == names
    for name in names:
        assert ours[name] == theirs[name], f"{case}: {name} differs from fairseq's"
    assert len(theirs["dict.mono.txt" if "-s" in extra else "dict.txt"].splitlines()) > 100
