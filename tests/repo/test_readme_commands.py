"""Every command README's "Summarize text" section and scripts/quickstart.sh print is run exactly as printed
(parsed from the files), in a folder holding what they expect: the tiny fairseq-tiny model as the checkpoint, its
data-bin, a few documents. Console scripts run from this checkout (shims on PATH)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.utils import REPO, load_script

SCRIPTS = {
    "seqtrain-generate": "generate",
    "seqtrain-interactive": "interactive",
    "seqtrain-score": "score",
    "seqtrain-eval": "eval",
    "seqtrain-tune": "tune",
}
N = 5


def readme_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Summarize text\n")
    return text[start : text.index("\n## ", start + 1)]


def commands(block: str) -> list[str]:
    """Shell commands of a ```bash block: continuation lines joined, trailing comments dropped."""
    joined = block.replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", line).strip() for line in joined.split("\n") if line.strip()]


def quickstart_commands() -> list[str]:
    """The commands quickstart.sh prints at its end (indented echo lines after "summarize your own text"),
    with $work expanded as the script sets it."""
    script = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    work = re.search(r'^work="([^"]+)"', script, re.M).group(1)
    tail = script[script.index("summarize your own text") :]
    return [m.replace("$work", work) for m in re.findall(r'^echo "  (.+)"$', tail, re.M)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.utils import FAIRSEQ_TINY

    if not (FAIRSEQ_TINY / "checkpoint_last.pt").exists():
        pytest.skip(f"fairseq fixture not found at {FAIRSEQ_TINY} (it lives in ../shared)")
    from seqtrain_cli.convert import main as convert

    d = tmp_path_factory.mktemp("docs")
    for ck in ("checkpoints", ".quickstart/checkpoints"):
        (d / ck).mkdir(parents=True)
        convert(
            [
                str(FAIRSEQ_TINY / "checkpoint_last.pt"),
                str(d / ck / "checkpoint_best.pt"),
                "--to",
                "seqtrain",
                "--dict",
                str(FAIRSEQ_TINY / "data-bin" / "dict.src.txt"),
            ]
        )
    shutil.copytree(FAIRSEQ_TINY / "data-bin", d / "data-bin")
    texts = (FAIRSEQ_TINY / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:N]
    (d / "new_docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    os.symlink(REPO / "configs", d / "configs")
    (d / "raw").mkdir()
    for side, ext in (("source", "src"), ("target", "tgt")):  # the test split's raw text, for seqtrain-eval
        shutil.copy(FAIRSEQ_TINY / "raw" / f"test.{ext}", d / "raw" / f"test.{side}")
    (d / "data" / "debdesc-sample").mkdir(parents=True)
    (d / "data" / "debdesc-sample" / "test.source").write_text("\n".join(texts) + "\n", encoding="utf-8")
    # the console scripts, running this checkout's code with this python
    shims = d / ".venv" / "bin"
    shims.mkdir(parents=True)
    for name, module in SCRIPTS.items():
        (shims / name).write_text(f'#!/bin/sh\nexec {sys.executable} -m seqtrain_cli.{module} "$@"\n')
        (shims / name).chmod(0o755)
    return d, texts


def run(folder, cmd: str, stdin: str = "") -> subprocess.CompletedProcess:
    d, _ = folder
    env = {**os.environ, "PATH": f"{d / '.venv' / 'bin'}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", "-c", "set -o pipefail; " + cmd], cwd=d, input=stdin, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-2000:]}"
    return proc


@pytest.mark.slow
def test_readme_summarize_section_commands_work_as_printed(folder):
    from seqtrain import Summarizer

    d, texts = folder
    section = readme_section()
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    cmds = [c for b in blocks for c in commands(b)]
    assert len(cmds) == 6 and all(c.split()[0] in SCRIPTS for c in cmds)
    want = Summarizer.from_pretrained(d / "checkpoints" / "checkpoint_best.pt").summarize(texts, beam=4)
    outs = [run(folder, c, stdin="\n".join(texts) + "\n").stdout for c in cmds]
    assert (d / "summaries.txt").read_text().split("\n")[:-1] == want  # command 1: > summaries.txt
    assert outs[1].split("\n")[:-1] == want  # seqtrain-interactive, piped
    # seqtrain-tune on the valid split: the preset the next command reads holds the settings it chose
    tuned = json.loads((d / "tuned" / "tune.json").read_text())
    assert "ROUGE-Lsum" in outs[2] and (d / "tuned" / "generation.yaml").exists() and tuned["trials"]
    assert len((d / "out" / "hypotheses-test.txt").read_text().split("\n")[:-1]) == 200
    assert re.match(r"ROUGE-1 [\d.]+ \| ROUGE-2", outs[4])
    report = json.loads((d / "report.json").read_text())  # seqtrain-eval: the same ROUGE, and its page
    assert report["n"] == 200 and f"ROUGE-1 {report['rouge']['rouge1']:.2f}" in outs[4]
    assert (d / "report.html").read_text().startswith("<!DOCTYPE html>")
    (python,) = re.findall(r"```python\n(.*?)```", section, re.S)
    ns: dict = {}
    cwd = os.getcwd()
    os.chdir(d)
    try:
        exec(compile(python, "README.md", "exec"), ns)
    finally:
        os.chdir(cwd)
    assert len(ns["summaries"]) == 2 and all(isinstance(s, str) for s in ns["summaries"])


@pytest.mark.slow
def test_quickstart_printed_commands_work_as_printed(folder):
    from seqtrain import Summarizer

    d, texts = folder
    cmds = quickstart_commands()
    assert len(cmds) == 2 and "seqtrain-generate" in cmds[0] and "seqtrain-interactive" in cmds[1]
    s = Summarizer.from_pretrained(d / ".quickstart" / "checkpoints" / "checkpoint_best.pt")
    want = s.summarize(texts[:3], beam=4, max_len_b=30, no_repeat_ngram_size=3)
    assert run(folder, cmds[0]).stdout.split("\n")[:-1] == want
    assert run(folder, cmds[1], stdin="\n".join(texts[:3]) + "\n").stdout.split("\n")[:-1] == want


# ---- "Train on your own data": raw pairs -> preprocess -> fine-tune -> summaries, as printed
# The suite runs the commands on part of the sample with the training cut to QUICK_UPDATES (a minute or two on 2
# cores). Beating the lead baseline takes more: on the sample's 300 test pairs, fine-tuned from the bundled model
# with these flags, ROUGE-1/2/Lsum were 34.52 / 17.24 / 31.81 after 50 updates, 36.16 / 19.08 / 33.57 after 100
# and 37.72 / 20.03 / 34.50 after 150, against lead's 36.52 / 17.72 / 31.75. That claim is checked by hand:
#   SEQTRAIN_OWN_DATA_UPDATES=150 python -m pytest --timeout 0 tests/repo/test_readme_commands.py -k own_data
# (the whole sample, --max-update cut to 150; SEQTRAIN_OWN_DATA_UPDATES=800 runs the printed commands unchanged).
QUICK_UPDATES = 40
QUICK_SIZES = {"train": 1000, "valid": 50, "test": 100}


def own_data_section() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## Train on your own data\n")
    section = text[start : text.index("\n## ", start + 1)]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[
        0
    ]  # the first block; the second is "from scratch"
    return commands(block)


@pytest.mark.slow
def test_readme_own_data_commands_work_as_printed(tmp_path):
    """The README's own-data commands, run as printed (the last flag wins: an appended --max-update cuts the
    training). Quick: the summaries of held-out pairs are synopses (short, scored), and training ended by naming
    its best checkpoint and these commands' generate step. With SEQTRAIN_OWN_DATA_UPDATES=N: the whole sample, N
    updates, and the summaries must beat the lead baseline on ROUGE-1, -2 and -Lsum."""
    try:
        lead_baseline = load_script("quality/lead_baseline")
    except ModuleNotFoundError as e:  # rouge-score missing (the GPU image)
        pytest.skip(f"lead_baseline needs rouge-score: {e}")
    full = int(os.environ.get("SEQTRAIN_OWN_DATA_UPDATES", "0"))
    cmds = own_data_section()
    assert [c.split()[0] for c in cmds] == ["seqtrain-preprocess", "seqtrain-train", "seqtrain-generate"]
    sample = tmp_path / "data" / "debdesc-sample"
    sample.mkdir(parents=True)
    for split, n in QUICK_SIZES.items():
        for side in ("source", "target"):
            lines = (
                (REPO / "data" / "debdesc-sample" / f"{split}.{side}")
                .read_text(encoding="utf-8")
                .splitlines()
            )
            (sample / f"{split}.{side}").write_text(
                "\n".join(lines[: None if full else n]) + "\n", encoding="utf-8"
            )
    for name in ("configs", "models"):
        os.symlink(REPO / name, tmp_path / name)
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in ("preprocess", "train", "generate"):
        (shims / f"seqtrain-{name}").write_text(
            f'#!/bin/sh\nexec {sys.executable} -m seqtrain_cli.{name} "$@"\n'
        )
        (shims / f"seqtrain-{name}").chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    logs = []
    for cmd in cmds:
        if cmd.startswith("seqtrain-train"):
            cmd += f" --max-update {full or QUICK_UPDATES}"
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
        logs.append(proc.stdout + proc.stderr)
    assert "best checkpoint: checkpoints/mydata/checkpoint_best.pt (loss " in logs[1]
    assert "seqtrain-generate data-bin/mydata --config configs/debdesc_small.yaml --path " in logs[1]
    model = json.loads((tmp_path / "out" / "mydata" / "rouge-test.json").read_text())
    hyps = (tmp_path / "out" / "mydata" / "hypotheses-test.txt").read_text(encoding="utf-8").splitlines()
    sources = (sample / "test.source").read_text(encoding="utf-8").splitlines()
    assert model["n"] == len(hyps) == len(sources) and all(hyps)
    # synopses, not the pretrained denoiser's copy of the description's start (30 tokens): a few words each
    assert sum(len(h.split()) for h in hyps) / len(hyps) < 12
    assert model["rougeLsum"] > 25
    if full:
        assert lead_baseline.main([str(sample / "test"), "--json", str(tmp_path / "lead.json")]) == 0
        lead = json.loads((tmp_path / "lead.json").read_text())
        for key in ("rouge1", "rouge2", "rougeLsum"):
            assert model[key] > lead[key], (key, model, lead)
