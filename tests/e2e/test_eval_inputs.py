"""seqtrain-eval's inputs and outputs under bad input (issue 48): an output never replaces an input, whatever the
path's spelling; --json and --html are written both or neither; names that are not UTF-8, training logs of a
diverged run or malformed records, endless lines, references that are all empty lines; the page's wording and
its truncation limit in the model's own pieces; no rouge-score noise on stderr. In process (seqtrain_cli.eval's
cli_main), except where a model is trained for the truncation limit."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import pytest

from seqtrain_cli.eval import cli_main
from tests.unit.evaluation.test_report import HYPOTHESES, _write, example_files

KEYS = {
    "--hyps": "hyps",
    "--source": "source",
    "--reference": "reference",
    "--compare": "other",
    "--train-source": "train",
}


@pytest.fixture
def files(tmp_path):
    return example_files(tmp_path)


def _run(files, *extra, capsys=None) -> tuple[int, str]:
    argv = ["--hyps", files["hyps"], "--source", files["source"], "--reference", files["reference"]]
    with pytest.raises(SystemExit) as e:
        cli_main(argv + ["--bootstrap", "0", *extra])
    return e.value.code, (capsys.readouterr().err if capsys is not None else "")


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("flag", ["--hyps", "--source", "--reference", "--compare", "--train-source"])
@pytest.mark.parametrize("spelling", ["same", "dotdot", "relative", "symlink", "hardlink"])
@pytest.mark.parametrize("out", ["--html", "--json"])
def test_an_output_onto_an_input_is_refused_by_any_spelling(
    files, tmp_path, capsys, monkeypatch, flag, spelling, out
):
    """Before: `--html s.txt --source s.txt` replaced the sources with the page, exit 0."""
    target = files[KEYS[flag]]
    if spelling == "dotdot":
        path = str(tmp_path / "sub" / ".." / os.path.basename(target))
        (tmp_path / "sub").mkdir()
    elif spelling == "relative":
        monkeypatch.chdir(tmp_path)
        path = os.path.basename(target)
    elif spelling == "symlink":
        path = str(tmp_path / "link.html")
        os.symlink(target, path)
    elif spelling == "hardlink":
        path = str(tmp_path / "hard.html")
        os.link(target, path)
    else:
        path = target
    before = {k: _digest(v) for k, v in files.items()}
    extra = [] if flag in ("--hyps", "--source", "--reference") else [flag, target]
    code, err = _run(files, *extra, out, path, capsys=capsys)
    assert code == 1 and err == (
        f"seqtrain-eval: error: {out} {path} is {flag} {target} (the same file): writing it would replace that "
        f"input; give {out} another file\n"
    )
    assert {k: _digest(v) for k, v in files.items()} == before


def test_an_input_folder_stands_for_its_hypotheses_file(files, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    hyps = _write(results / "hypotheses-valid.txt", HYPOTHESES)
    code, err = _run({**files, "hyps": str(results)}, "--json", hyps, capsys=capsys)
    assert code == 1 and f"--json {hyps} is --hyps {hyps} (the same file)" in err
    assert open(hyps, encoding="utf-8").read() == "".join(h + "\n" for h in HYPOTHESES)


def test_json_and_html_the_same_file_or_a_failing_one_write_neither(files, tmp_path, capsys):
    same = str(tmp_path / "r.out")
    code, err = _run(files, "--json", same, "--html", same, capsys=capsys)
    assert code == 1 and err == (
        f"seqtrain-eval: error: --json {same} and --html {same} are the same file: one output would replace the "
        "other; give each its own file\n"
    )
    # the page fails (a full device) after the JSON is done: neither is written (before, the JSON stayed)
    code, err = _run(files, "--json", str(tmp_path / "r.json"), "--html", "/dev/full", capsys=capsys)
    assert code == 1 and err.startswith(
        "seqtrain-eval: error: /dev/full: cannot write (No space left on device)"
    )
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in files.values())


def test_a_read_only_folder_is_named_not_the_temporary_file(files, tmp_path, capsys, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", os.path.join(kwargs["dir"], ".r.html.x1y2z3.tmp"))

    monkeypatch.setattr(
        tempfile, "mkstemp", refuse
    )  # what a read-only folder does to the writer (root or not)
    code, err = _run(files, "--html", str(tmp_path / "r.html"), capsys=capsys)
    assert (code, err) == (
        1,
        f"seqtrain-eval: error: {tmp_path / 'r.html'}: cannot write (Permission denied); no result file was "
        "written\n",
    )


def test_names_and_title_that_are_not_utf8_are_shown_as_replacement_characters(files, tmp_path, capsys):
    """A file name or --title with bytes that are not UTF-8 reached the page as surrogate escapes:
    UnicodeEncodeError after the JSON was written. Now both are written, as valid UTF-8."""
    raw = os.fsencode(str(tmp_path)) + b"/hyp-\xff.txt"
    with open(raw, "wb") as f:
        f.write(open(files["hyps"], "rb").read())
    title = os.fsdecode(b"run \xe9")  # what argv holds for these bytes
    code, _ = _run({**files, "hyps": os.fsdecode(raw)}, "--title", title, "--json", str(tmp_path / "r.json"),
                   "--html", str(tmp_path / "r.html"), capsys=capsys)  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "r.json").read_bytes().decode("utf-8"))
    assert report["hypotheses"] == f"{tmp_path}/hyp-\ufffd.txt"
    page = (tmp_path / "r.html").read_bytes().decode("utf-8")
    assert "<title>run \ufffd</title>" in page and "hyp-\ufffd.txt" in page


@pytest.mark.parametrize("which", ["reference", "source"])
def test_references_or_sources_all_empty_are_refused(files, tmp_path, capsys, which):
    files[which] = _write(tmp_path / "blank.txt", ["", " ", "", "\t"])
    code, err = _run(files, capsys=capsys)
    what = "references" if which == "reference" else "sources"
    assert (code, err) == (
        1,
        f"seqtrain-eval: error: {files[which]}: all 4 {what} are empty lines; nothing to score against\n",
    )


@pytest.mark.parametrize("flag", ["--hyps", "--source", "--train-log"])
def test_an_endless_line_is_refused_at_the_bound(files, tmp_path, capsys, flag):
    """A file or device without line ends (/dev/zero) was read whole: gigabytes in seconds, then MemoryError."""
    from seqtrain.fileio import MAX_LINE_BYTES

    endless = tmp_path / "endless.txt"
    with open(endless, "wb") as f:  # a sparse file: no disk, all zero bytes, no line end
        f.truncate(MAX_LINE_BYTES + 10)
    path = "/dev/zero" if flag == "--hyps" else str(endless)
    extra = [flag, path] if flag == "--train-log" else []
    code, err = _run({**files, KEYS.get(flag, ""): path}, *extra, capsys=capsys)
    name = f"--train-log {path}" if flag == "--train-log" else path
    assert (code, err) == (
        1,
        f"seqtrain-eval: error: {name}:1: no line end within 16 MiB (16,777,216 bytes); a text input holds one "
        "example per line (is this a text file?)\n",
    )


def test_train_log_of_a_diverged_run_and_malformed_records(files, tmp_path, capsys):
    """NaN, inf or huge values, steps that are strings, lists or dicts, text that is not UTF-8, deep nesting:
    tracebacks in page._ticks and analyses.validation_curves before. A diverged run's curve is drawn with its
    non-finite points marked; a malformed record is skipped and counted."""
    log = tmp_path / "train.log"
    rows = [
        b'x | valid | {"valid_loss": "5.5", "valid_num_updates": "100"}',
        b'x | valid | {"valid_loss": "nan", "valid_num_updates": 200}',
        b'x | valid | {"valid_loss": Infinity, "valid_ppl": 1e300, "valid_num_updates": 300}',
        b'{"tag": "valid", "step": "400", "loss": 4.5, "ppl": -1e308}',
        b'{"tag": "valid", "step": [1], "loss": 1.0}',
        b'{"tag": "valid", "step": {"a": 1}, "loss": 1.0}',
        b'{"tag": "valid", "step": 1e300, "loss": 1.0}',
        b'{"tag": "valid", "step": "x", "loss": 1.0}',
        b'x | valid | {"valid_loss": "caf\xe9", "valid_num_updates": 500}',
        b'x | valid | {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b"a line that is no record",
    ]
    log.write_bytes(b"\n".join(rows) + b"\n")
    code, _ = _run(files, "--train-log", str(log), "--json", str(tmp_path / "r.json"), "--html",
                   str(tmp_path / "r.html"))  # fmt: skip
    assert code == 0
    curves = json.loads((tmp_path / "r.json").read_text())["validation_curves"]
    assert curves["skipped"] == 6  # four steps, the undecodable record, the nesting
    assert curves["subsets"]["valid"] == {
        "loss": [[100, 5.5], [200, None], [300, None], [400, 4.5]],
        "ppl": [[300, 1e300], [400, -1e308]],
    }
    page = (tmp_path / "r.html").read_text()
    assert page.count("&#215;<title>") == 4  # the two non-finite losses and the two ppl beyond the chart
    assert "6 malformed records of the log skipped" in page
    assert f"--train-log {log}: 6 malformed records skipped\n" in capsys.readouterr().out


def test_the_page_says_hypotheses_and_rouge_score_logs_no_info_line(files, tmp_path, caplog):
    """Issue 48, class 11: "hypothesiss" in the page; rouge-score's `INFO | absl | Using default tokenizer.` in
    every eval, generate and tune run."""
    logging.getLogger("absl").setLevel(logging.NOTSET)  # as a fresh process has it
    caplog.set_level(logging.INFO)
    code, _ = _run(files, "--html", str(tmp_path / "r.html"))
    assert code == 0 and [r for r in caplog.records if r.name == "absl"] == []
    page = (tmp_path / "r.html").read_text()
    assert "hypothesiss" not in page and '<td class="l">hypotheses</td>' in page
    # the check sees the line: rouge-score imported without seqtrain.scoring.rouge.rouge_scorer logs it
    logging.getLogger("absl").setLevel(logging.NOTSET)
    from rouge_score import rouge_scorer

    rouge_scorer.RougeScorer(["rouge1"])
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == ["Using default tokenizer."]
    logging.getLogger("absl").setLevel(logging.WARNING)


@pytest.mark.slow
def test_truncation_counts_the_models_pieces_against_its_limit(toy_databin, tmp_path, capsys):
    """Issue 48, class 11: the truncation section used 1,024 words even when the model reads 8 positions; with
    --path it cuts each source where the model does (7 pieces and </s>; the toy tokenizer's pieces are words)."""
    from seqtrain_cli.train import train_main
    from tests.utils import base_args

    data = toy_databin(n_train=40, n_valid=12)
    save = str(tmp_path / "ck")
    train_main(base_args(data, save, "--max-update", "1", "--max-source-positions", "8", "--max-target-positions",
                         "8", "--truncate-source", "--encoder-layers", "1", "--decoder-layers", "1"))  # fmt: skip
    sources = (
        open(os.path.join(os.path.dirname(data), "raw", "valid.src"), encoding="utf-8").read().splitlines()
    )
    refs = [s.split()[-1] for s in sources]  # the last word: past the limit when the source is cut
    files = {
        "hyps": _write(tmp_path / "hyp.txt", refs),
        "source": _write(tmp_path / "src.txt", sources),
        "reference": _write(tmp_path / "ref.txt", refs),
    }
    code, _ = _run(files, "--path", f"{save}/checkpoint_last.pt", "--json", str(tmp_path / "r.json"), "--html",
                   str(tmp_path / "r.html"))  # fmt: skip
    assert code == 0
    t = json.loads((tmp_path / "r.json").read_text())["truncation"]
    cut = [s.split() for s in sources if len(s.split()) > 7]
    past = [1.0 if w[-1] not in w[:7] else 0.0 for w in cut]
    assert cut and t == {
        "limit": 8,
        "unit": "pieces",
        "model": f"{save}/checkpoint_last.pt",
        "sources_over_limit": len(cut),
        "reference_past_limit_mean": pytest.approx(sum(past) / len(sources)),
        "references_with_words_past_limit": int(sum(past)),
    }
    out = capsys.readouterr().out
    assert (
        f"truncation at 8 pieces of {save}/checkpoint_last.pt's tokenizer (its max_source_positions): " in out
    )
    assert f"At 8 pieces of {save}/checkpoint_last.pt&#x27;s tokenizer" in (tmp_path / "r.html").read_text()
