"""seqtrain-generate end to end: fairseq's output lines and scores, every example once, raw text, bad input."""

import io
import json
import re
import shutil
import subprocess
import sys

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain_cli.generate import generate_main


def _parse(lines):
    """{id: {"S": str, "T": str, "H": [(score, str)], "P": [[float]]}} from S-/T-/H-/P- lines."""
    out = {}
    for line in lines:
        m = re.match(r"^([STHDP])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, sid, rest = m.group(1), int(m.group(2)), m.group(3)
        e = out.setdefault(sid, {"H": [], "P": []})
        if kind in "ST":
            e[kind] = rest
        elif kind == "H":
            score, text = rest.split("\t")
            e["H"].append((float(score), text))
        elif kind == "P":
            e["P"].append([float(x) for x in rest.split()])
    return out


def _fairseq_lines(path):
    return path.read_text(encoding="utf-8").split("\n")


FLAGS = {
    "generate_beam4_valid.log": "--beam 4 --batch-size 64",
    "generate_nbest5_minlen7_valid.log": "--beam 5 --nbest 5 --lenpen 2.0 --min-len 7 --max-len-a 0 --max-len-b 9 "
    "--batch-size 64",
}


@pytest.mark.parametrize("log", sorted(FLAGS))
def test_matches_fairseq_generate_logs(fairseq_tiny, log):
    """The CLI on fairseq's own checkpoint and data-bin writes fairseq's hypotheses and base-2 scores."""
    argv = [
        str(fairseq_tiny / "data-bin"),
        "--path",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "--gen-subset",
        "valid",
        "--cpu",
        "-s",
        "src",
        "-t",
        "tgt",
    ] + FLAGS[log].split()
    out = io.StringIO()
    generate_main(argv, out=out)
    ours = _parse(out.getvalue().split("\n"))
    ref = _parse(_fairseq_lines(fairseq_tiny / log))
    assert sorted(ours) == sorted(ref) == list(range(200))
    for sid, r in ref.items():
        o = ours[sid]
        assert o["S"] == r["S"] and o["T"] == r["T"]
        assert [h for _, h in o["H"]] == [h for _, h in r["H"]], sid
        for (so, _), (sr, _) in zip(o["H"], r["H"]):
            assert abs(so - sr) < 1e-4
        for po, pr in zip(o["P"], r["P"]):
            # P- values are printed with 4 decimals: a tiny difference can flip the last digit, so allow one unit
            assert len(po) == len(pr) and max(abs(a - b) for a, b in zip(po, pr)) <= 1e-4 + 1e-9


@pytest.mark.slow
def test_every_example_once_in_input_order_at_any_batch_size(fairseq_tiny, tmp_path):
    """fairseq drops a final batch smaller than --required-batch-size-multiple; we never drop one, and the
    hypothesis of a sentence does not depend on its batch (fp32)."""
    base = [
        str(fairseq_tiny / "data-bin"),
        "--path",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "--gen-subset",
        "test",
        "--cpu",
        "-s",
        "src",
        "-t",
        "tgt",
        "--beam",
        "3",
        "--quiet",
    ]
    res = {}
    for bs in ("1", "7", "64"):
        d = tmp_path / bs
        r = generate_main(
            base + ["--batch-size", bs, "--required-batch-size-multiple", "8", "--results-path", str(d)],
            out=io.StringIO(),
        )
        lines = (d / "hypotheses-test.txt").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(lines) == 200 == r["n"]
        refs = (d / "references-test.txt").read_text(encoding="utf-8").split("\n")[:-1]
        raw = (fairseq_tiny / "raw" / "test.tgt").read_text(encoding="utf-8").split("\n")[:-1]
        assert refs == raw  # input order, the reference file lines up with the hypothesis file
        res[bs] = lines
    assert res["1"] == res["7"] == res["64"]
    # the task is "first five source tokens reversed": a trained model gets most exactly right
    assert sum(h == t for h, t in zip(res["64"], refs)) > 150


@pytest.mark.slow
def test_raw_text_input_and_stdin(fairseq_tiny, tmp_path):
    src = (fairseq_tiny / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:12]
    tgt = (fairseq_tiny / "raw" / "valid.tgt").read_text(encoding="utf-8").split("\n")[:12]
    (tmp_path / "in.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    ck = str(fairseq_tiny / "checkpoint_last.pt")
    data = str(fairseq_tiny / "data-bin")
    out = io.StringIO()
    r = generate_main(
        [
            data,
            "--path",
            ck,
            "-s",
            "src",
            "-t",
            "tgt",
            "--cpu",
            "--beam",
            "4",
            "--input",
            str(tmp_path / "in.txt"),
            "--reference",
            str(tmp_path / "ref.txt"),
            "--scoring",
            "rouge",
            "--results-path",
            str(tmp_path / "res"),
            "--output-format",
            "fairseq",
        ],
        out=out,
    )
    assert len(r["hypotheses"]) == 12
    assert sum(h == t for h, t in zip(r["hypotheses"], tgt)) >= 9
    js = json.loads((tmp_path / "res" / "rouge-input.json").read_text())
    assert js["rouge1"] == pytest.approx(r["rouge"]["rouge1"]) and js["rouge1"] > 80
    assert re.search(r"Generate input with beam=4: .*R", out.getvalue())
    # the same through the console script reading stdin
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqtrain_cli.generate",
            data,
            "--path",
            ck,
            "-s",
            "src",
            "-t",
            "tgt",
            "--cpu",
            "--beam",
            "4",
            "--input",
            "-",
        ],
        input="\n".join(src) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # by default with --input: stdout holds exactly one summary per input line, in input order
    assert proc.stdout.split("\n")[:-1] == r["hypotheses"]
    assert "Generated 12 sentences" in proc.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--beam", "0"], "argument --beam: must be between 1 and 10000, got 0"),
        (["--min-len", "20", "--max-len-b", "9"], "--min-len 20 is above the maximum length --max-len-b 9"),
        (["--gen-subset", "nosuch"], "--gen-subset nosuch: no such split"),
        (["--batch-size", "0"], "argument --batch-size/--max-sentences: must be between 1 and"),
        (["--nbest", "6", "--beam", "5"], "--nbest must be between 1 and --beam"),
    ],
)
def test_bad_flags_give_one_clear_error(fairseq_tiny, extra, message):
    argv = [
        str(fairseq_tiny / "data-bin"),
        "--path",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "--cpu",
        "-s",
        "src",
        "-t",
        "tgt",
        "--gen-subset",
        "valid",
    ] + extra
    with pytest.raises(SeqtrainError, match=re.escape(message)):
        generate_main(argv, out=io.StringIO())


def test_dictionary_differing_from_checkpoint_is_refused(fairseq_tiny, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(fairseq_tiny / "data-bin", data)
    # the checkpoint is fairseq's (no dictionary inside): it takes dict.src.txt; a changed dict.tgt.txt must be caught
    lines = (data / "dict.tgt.txt").read_text(encoding="utf-8").split("\n")
    lines[0], lines[1] = lines[1], lines[0]
    (data / "dict.tgt.txt").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(SeqtrainError, match="dict.tgt.txt: the target dictionary differs"):
        generate_main(
            [
                str(data),
                "--path",
                str(fairseq_tiny / "checkpoint_last.pt"),
                "--cpu",
                "-s",
                "src",
                "-t",
                "tgt",
                "--gen-subset",
                "valid",
            ],
            out=io.StringIO(),
        )


@pytest.mark.slow
def test_console_script_error_is_one_line(fairseq_tiny, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqtrain_cli.generate",
            str(fairseq_tiny / "data-bin"),
            "--path",
            str(tmp_path / "missing.pt"),
            "--cpu",
            "-s",
            "src",
            "-t",
            "tgt",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    err = [line for line in proc.stderr.strip().split("\n") if line.startswith("seqtrain-generate: error:")]
    assert len(err) == 1 and "missing.pt" in err[0] and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_end_to_end_on_bundled_sample(sample_dir, tmp_path):
    """preprocess (sentencepiece) -> train a tiny BART -> generate: every output form, detokenized, plus ROUGE."""
    import torch

    from seqtrain_cli.preprocess import preprocess_main as preprocess
    from seqtrain_cli.train import train_main

    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 400), ("valid", 40), ("test", 25)):
        for side in ("source", "target"):
            lines = (sample_dir / f"{split}.{side}").read_text(encoding="utf-8").split("\n")[:n]
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = str(tmp_path / "bin")
    preprocess(
        [
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--testpref",
            str(raw / "test"),
            "--destdir",
            data,
            "--spm-vocab-size",
            "600",
            "--joined-dictionary",
            "--no-progress-bar",
        ]
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_main(
            [
                data,
                "--arch",
                "bart_tiny",
                "--cpu",
                "--max-tokens",
                "2048",
                "--max-update",
                "40",
                "--lr",
                "3e-3",
                "--lr-scheduler",
                "inverse_sqrt",
                "--warmup-updates",
                "10",
                "--criterion",
                "label_smoothed_cross_entropy",
                "--label-smoothing",
                "0.1",
                "--truncate-source",
                "--max-source-positions",
                "128",
                "--save-dir",
                str(tmp_path / "ck"),
                "--log-format",
                "none",
                "--no-epoch-checkpoints",
            ]
        )
        out = io.StringIO()
        res = tmp_path / "res"
        # no tokenizer or dictionary flags: the checkpoint carries them
        r = generate_main(
            [
                data,
                "--path",
                str(tmp_path / "ck" / "checkpoint_last.pt"),
                "--beam",
                "3",
                "--max-len-b",
                "20",
                "--batch-size",
                "8",
                "--scoring",
                "rouge",
                "--results-path",
                str(res),
            ],
            out=out,
        )
    finally:
        torch.set_num_threads(threads)
    text = out.getvalue()
    parsed = _parse(text.split("\n"))
    assert sorted(parsed) == list(range(25))
    for kind in ("S-", "T-", "H-", "D-", "P-"):
        assert sum(line.startswith(kind) for line in text.split("\n")) == 25
    hyps = (res / "hypotheses-test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    refs = (res / "references-test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == 25 and hyps == r["hypotheses"]
    assert refs == (raw / "test.target").read_text(encoding="utf-8").split("\n")[:-1]
    # D- lines and the hypothesis file are detokenized text, H- lines are sentencepiece pieces
    assert all("\u2581" not in h for h in hyps)
    assert any("\u2581" in e["H"][0][1] for e in parsed.values())
    assert re.search(
        r"^Generate test with beam=3: ROUGE-1 [\d.]+ \| ROUGE-2 [\d.]+ \| ROUGE-L [\d.]+ \| "
        r"ROUGE-Lsum [\d.]+",
        text,
        re.M,
    )
    js = json.loads((res / "rouge-test.json").read_text())
    assert set(js) >= {"rouge1", "rouge2", "rougeL", "rougeLsum"} and js["n"] == 25
    assert (res / "generate-test.txt").read_text(encoding="utf-8").count("\nH-") + 1 >= 25
