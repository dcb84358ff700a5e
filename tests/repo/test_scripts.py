"""The helper scripts of the quickstart and the quality run: lead baseline, curve plotting from json logs, and the
shell scripts' syntax and failure modes (the full quickstart takes minutes; it is run by hand, not here)."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from seqtrain.errors import SeqtrainError
from tests.utils import REPO, load_script

ROOT = str(REPO)
LEAD_MISSING = None
try:
    lead_baseline = load_script("quality/lead_baseline")  # scores with rouge-score
except ModuleNotFoundError as e:  # no rouge-score (the GPU image): its test skips, the others run
    lead_baseline, LEAD_MISSING = None, f"lead_baseline needs rouge-score: {e}"
plot_curves = load_script("quality/plot_curves")


def test_lead_baseline_is_first_sentence_cut_to_12_words(tmp_path):
    if lead_baseline is None:
        pytest.skip(LEAD_MISSING)
    assert lead_baseline.lead("GNU Emacs editor. It is extensible.") == "GNU Emacs editor"
    long = " ".join(f"w{i}" for i in range(20)) + ". Second."
    assert lead_baseline.lead(long) == " ".join(f"w{i}" for i in range(12))
    assert lead_baseline.lead("version 1.2.3 of the tool") == "version 1.2.3 of the tool"  # '.' without space
    (tmp_path / "d.source").write_text(
        "fast json parser library. It parses json.\nsmall tool. More text here.\n"
    )
    (tmp_path / "d.target").write_text("fast json parser library\nsome other words\n")
    out = tmp_path / "scores.json"
    assert (
        lead_baseline.main([str(tmp_path / "d"), "--json", str(out), "--hypotheses", str(tmp_path / "h")])
        == 0
    )
    scores = json.loads(out.read_text())
    # pair 1 is exact (100); pair 2 shares nothing (0)
    assert (scores["rouge1"], scores["rouge2"], scores["rougeLsum"], scores["n"]) == (50.0, 50.0, 50.0, 2)
    assert (tmp_path / "h").read_text() == "fast json parser library\nsmall tool\n"


def _json_log(path, records):
    """Write records exactly as seqtrain-train's json progress bar and --log-file formatter do."""
    from seqtrain.logging import formatter
    from seqtrain.logging.progress import progress_bar

    handler = logging.FileHandler(path)
    handler.setFormatter(formatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        bar = progress_bar(range(100), "json", epoch=1)
        for tag, step, stats in records:
            (bar.log if tag == "train_inner" else bar.print)(stats, tag=tag, step=step)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


def test_plot_curves_reads_train_and_valid_points(tmp_path):
    log = tmp_path / "train.log"
    _json_log(
        log,
        [
            ("train_inner", 10, {"loss": 9.5, "nll_loss": 9.4, "num_updates": 10, "wall": 30.0}),
            ("train_inner", 20, {"loss": 8.25, "nll_loss": 8.0, "num_updates": 20, "wall": 60.0}),
            ("valid", 20, {"loss": 8.5, "nll_loss": 8.3, "num_updates": 20}),
            ("valid1", 20, {"loss": 8.75, "num_updates": 20}),  # a second --valid-subset
            ("train", 20, {"loss": 8.9, "num_updates": 20, "wall": 61.0}),  # epoch summary: not a curve point
            ("train_inner", 30, {"loss": 7.75, "nll_loss": 7.5, "num_updates": 30, "wall": 90.0}),
        ],
    )
    curves = plot_curves.read_json_log(str(log))
    assert curves["train"]["loss"] == [(10.0, 30.0, 9.5), (20.0, 60.0, 8.25), (30.0, 90.0, 7.75)]
    assert curves["valid"]["loss"] == [(20.0, 60.0, 8.5)]
    assert curves["valid"]["nll_loss"] == [(20.0, 60.0, 8.3)]
    assert curves["valid1"] == {"loss": [(20.0, 60.0, 8.75)]}
    assert sorted(curves) == ["train", "valid", "valid1"]

    pytest.importorskip("matplotlib")
    png = tmp_path / "img" / "curves.png"
    assert plot_curves.main([str(log), "-o", str(png)]) == 0
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1210, 462)  # 11 x 4.2 inches at 110 dpi


def test_plot_curves_reads_the_jsonl_log_quickstart_writes(tmp_path, monkeypatch, capsys):
    """scripts/quickstart.sh trains with --jsonl-log (its terminal shows a bar, its --log-file simple lines):
    the tracker's records give the same curves as a json log."""
    from seqtrain.logging.trackers import JsonLinesTracker

    path = tmp_path / "train.jsonl"
    t = JsonLinesTracker(str(path))
    t.log("train_inner", {"loss": 9.5, "nll_loss": 9.4, "num_updates": 10, "wall": 30.0}, 10)
    t.log("valid", {"loss": 8.5, "nll_loss": 8.3, "num_updates": 20, "best_loss": 8.5}, 20)
    t.log("train", {"loss": 8.9, "num_updates": 20, "wall": 61.0}, 20)
    t.log("train_inner", {"loss": 8.25, "nll_loss": 8.0, "num_updates": 20, "wall": 60.0}, 20)
    t.close()
    curves = plot_curves.read_json_log(str(path))
    assert curves["train"]["loss"] == [(10.0, 30.0, 9.5), (20.0, 60.0, 8.25)]
    assert curves["valid"] == {"loss": [(20.0, 30.0, 8.5)], "nll_loss": [(20.0, 30.0, 8.3)]}
    assert sorted(curves) == ["train", "valid"]
    # without matplotlib: one line saying what to install, no traceback, nothing written
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot_curves.main([str(path), "-o", str(tmp_path / "c.png")]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "plot_curves.py: error: needs matplotlib to draw (pip install -e '.[plot]' or pip install matplotlib)\n"
    )
    assert not (tmp_path / "c.png").exists()
    script = (REPO / "scripts" / "quickstart.sh").read_text()
    assert '--jsonl-log "$work/train.jsonl"' in script and "plot_curves.py $work/train.jsonl" in script


def test_quickstart_header_and_readme_give_the_same_minutes():
    """The script's header said 6 minutes while the README said 8 (measured: 482 s from a fresh clone)."""
    header = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8").split("\nset -")[0]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"about (\d+) minutes", " ".join(header.replace("#", " ").split()))
    said += re.findall(r"about (\d+) minutes on an idle", readme) + re.findall(
        r"\(~(\d+) min on CPU\)", readme
    )
    assert len(said) == 3 and len(set(said)) == 1, said
    seconds = int(
        re.search(r"From a fresh clone on an idle 2-core machine: ([\d,]+) s in all", readme).group(1)
    )
    assert abs(seconds / 60 - int(said[0])) <= 1


def test_quickstart_reuses_its_joined_data_bin(tmp_path):
    """Stage 2's reuse test, run as the script has it, on data-bins laid out as seqtrain-preprocess
    --joined-dictionary writes them (dict.source.txt / dict.target.txt: there is no dict.txt)."""
    script = (REPO / "scripts" / "quickstart.sh").read_text()
    cond = re.search(
        r"^if (\[ -f \"\$work/data-bin/preprocess.json\" \].*?); then$", script, re.S | re.M
    ).group(1)
    pretrained = re.search(r'^pretrained="([^"]+)"', script, re.M).group(1)
    dictionary = (REPO / pretrained / "dict.txt").read_bytes()

    def reused(files: dict[str, bytes]) -> bool:
        shutil.rmtree(tmp_path / ".quickstart", ignore_errors=True)
        (tmp_path / ".quickstart" / "data-bin").mkdir(parents=True)
        for name, data in files.items():
            (tmp_path / ".quickstart" / "data-bin" / name).write_bytes(data)
        out = subprocess.run(
            ["bash", "-c", f'work=.quickstart; pretrained="{REPO / pretrained}"; if {cond}; then echo y; fi'],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        return out.stdout == "y\n"

    done = {"preprocess.json": b"{}", "dict.source.txt": dictionary, "dict.target.txt": dictionary}
    assert reused(done)
    assert not reused({**done, "dict.target.txt": b"a 1\n"})  # another dictionary: preprocess again
    assert not reused({k: v for k, v in done.items() if k != "preprocess.json"})  # an interrupted preprocess


def test_plot_curves_refuses_a_log_without_json_lines(tmp_path):
    log = tmp_path / "simple.log"
    log.write_text(
        "2026-11-29 21:02:08 | INFO | train_inner | epoch 003:     2 / 4 loss=4.882, num_updates=10\n"
    )
    with pytest.raises(SeqtrainError, match="no train_inner JSON lines"):
        plot_curves.read_json_log(str(log))


@pytest.mark.parametrize(
    "script",
    [
        "quickstart.sh",
        "setup_env.sh",
        "test.sh",
        "quality/quality_run.sh",
        "quality/pretrain.sh",
        "gpu/gpu_check.sh",
        "gpu/gpu_speed.sh",
    ],
)
def test_shell_scripts_parse(script):
    out = subprocess.run(
        ["bash", "-n", os.path.join(ROOT, "scripts", script)], capture_output=True, text=True
    )
    assert (out.returncode, out.stderr) == (0, "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
@pytest.mark.slow
@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_speed.sh"])
def test_gpu_scripts_fail_clearly_without_cuda(tmp_path, script):
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path)}
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu", script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 1
    assert "sees no CUDA device" in out.stderr
    assert out.stderr.strip().endswith(
        f"{script}: error: no usable CUDA device (see the line above); this script needs one GPU"
    )
    assert os.listdir(tmp_path) == []  # stopped before writing anything


def test_source_dependence_gap_is_zero_exactly_when_the_source_is_cut_off():
    """scripts/quality/source_dependence.py: a model whose cross-attention outputs are zeroed scores rotated sources
    exactly like true ones (gap 0); the same model with its cross-attention intact does not."""
    source_dependence = load_script("quality/source_dependence")
    from seqtrain.data.dictionary import Dictionary
    from seqtrain.data.pair_dataset import LanguagePairDataset
    from seqtrain.models.bart import BartConfig, BARTModel

    d = Dictionary()
    for i in range(40):
        d.add_symbol(f"w{i}")
    g = torch.Generator().manual_seed(0)
    src = [
        torch.cat([torch.randint(4, len(d), (n,), generator=g), torch.tensor([2])]) for n in (5, 9, 3, 7, 6)
    ]
    tgt = [
        torch.cat([torch.randint(4, len(d), (n,), generator=g), torch.tensor([2])]) for n in (3, 2, 4, 3, 5)
    ]
    ds = LanguagePairDataset(src, [len(s) for s in src], d, tgt, [len(t) for t in tgt], d)
    torch.manual_seed(0)
    model = BARTModel(
        BartConfig(
            vocab_size=len(d),
            encoder_layers=1,
            decoder_layers=1,
            encoder_embed_dim=16,
            decoder_embed_dim=16,
            encoder_ffn_embed_dim=32,
            decoder_ffn_embed_dim=32,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            weight_init="xavier",
        )
    )
    live = source_dependence.source_dependence(model, ds, batch_size=5)
    assert abs(live["gap"]) > 1e-3 and live["real"] > 0
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.encoder_attn.out_proj.weight.zero_()
            layer.encoder_attn.out_proj.bias.zero_()
    cut = source_dependence.source_dependence(model, ds, batch_size=5)
    assert cut["gap"] == 0.0 and cut["real"] == cut["shuffled"] > 0


def test_scripts_readme_lists_every_script_and_no_script_imports_the_tests():
    """scripts/README.md is the map: every script there is named in it (as its path under scripts/), and the
    scripts use the package, never the test suite."""
    root = pathlib.Path(ROOT) / "scripts"
    readme = (root / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".sh"))
    assert len(scripts) > 20
    missing = [str(p.relative_to(root)) for p in scripts if f"`{p.relative_to(root)}`" not in readme]
    assert not missing, missing
    for p in scripts:
        text = p.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import) tests\b", text, re.M), p
    assert sorted(p.name for p in root.iterdir() if p.is_file()) == [
        "README.md",
        "quickstart.sh",
        "setup_env.sh",
        "test.sh",
    ]


def test_pretrain_text_cuts_descriptions_into_sentences_of_at_most_max_words(tmp_path):
    """scripts/quality/pretrain_text.py: one sentence per line, long ones cut at --max-words words; the last
    --held-out descriptions are the valid split, every other one train (nothing lost, nothing added)."""
    pretrain_text = load_script("quality/pretrain_text")
    assert pretrain_text.lines_of("0ad is a game. It runs on Linux!  Version 2 (beta) too.", 20) == [
        "0ad is a game.",
        "It runs on Linux!",
        "Version 2 (beta) too.",
    ]
    words = " ".join(f"w{i}" for i in range(45))
    assert [len(x.split()) for x in pretrain_text.lines_of(words, 20)] == [20, 20, 5]
    source = tmp_path / "train.source"
    source.write_text("".join(f"Package {i} does things. It is free.\n" for i in range(10)), encoding="utf-8")
    out = tmp_path / "raw"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/quality/pretrain_text.py"),
            str(source),
            str(out),
            "--held-out",
            "3",
        ],
        check=True,
        capture_output=True,
    )
    train = (out / "train").read_text(encoding="utf-8").splitlines()
    valid = (out / "valid").read_text(encoding="utf-8").splitlines()
    assert train[:2] == ["Package 0 does things.", "It is free."] and len(train) == 14
    assert valid == [f"{s}" for i in (7, 8, 9) for s in (f"Package {i} does things.", "It is free.")]


def test_pretrain_sh_names_a_missing_corpus(tmp_path):
    out = subprocess.run(
        ["bash", str(REPO / "scripts/quality/pretrain.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "DEBDESC": str(tmp_path / "nowhere")},
        cwd=tmp_path,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"pretrain.sh: error: {tmp_path / 'nowhere'}/train.source not found (set DEBDESC=folder of the corpus)"
    )


def test_bench_packed_encoder_batches_as_generate_batches():
    """bench_packed_encoder.py's two orders: unsorted batches as the sources come, sorted ones spread over the
    length-sorted set (shortest to longest)."""
    bench = load_script("bench/bench_packed_encoder")
    srcs = [[5] * n for n in (3, 9, 1, 7, 5, 2, 8, 4)]
    assert bench.batches_of(srcs, 2, 2, "unsorted") == [srcs[0:2], srcs[2:4]]
    assert [[len(s) for s in b] for b in bench.batches_of(srcs, 2, 2, "sorted")] == [[1, 2], [8, 9]]
    assert [[len(s) for s in b] for b in bench.batches_of(srcs, 2, 3, "sorted")] == [[1, 2], [5, 7], [8, 9]]


def test_distill_run_names_a_missing_teacher(tmp_path):
    """scripts/quality/distill_run.sh starts from the quickstart's model: without it, one line saying so."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts/quality/distill_run.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "TEACHER": str(tmp_path / "none.pt"), "OUT": str(tmp_path / "out")},
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"distill_run.sh: error: TEACHER={tmp_path / 'none.pt'} not found (run scripts/quickstart.sh first)"
    )
    assert not (tmp_path / "out").exists()
