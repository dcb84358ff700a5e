"""seqtrain-preprocess --jsonl: JSON lines give byte for byte the data-bin of the equivalent line files, for any
--workers, and every bad line is a one-line error naming file and line that writes nothing."""

from __future__ import annotations

import json
import os

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain_cli.preprocess import preprocess_main as main


def _data_files(folder) -> dict:
    """Every output file but preprocess.json (which records the flags, that differ), plus its figures."""
    out = {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder)) if n != "preprocess.json"}
    summary = json.loads((folder / "preprocess.json").read_text())
    for split in summary["splits"].values():
        for side in split.values():
            side["input"] = os.path.splitext(os.path.basename(side["input"]))[
                0
            ]  # train.jsonl / train.document
    out["figures"] = (summary["splits"], summary["dictionaries"], summary["tokenizer"])
    return out


@pytest.fixture
def corpus(tmp_path, sample_dir):
    """200/50 pairs of the bundled sample as line files (document/summary) and as JSON lines; one JSON document
    holds line breaks, which the line files have as spaces."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 200), ("valid", 50)):
        src = open(sample_dir / f"{split}.source", encoding="utf-8").read().splitlines()[:n]
        tgt = open(sample_dir / f"{split}.target", encoding="utf-8").read().splitlines()[:n]
        rows = [{"id": i, "document": s, "summary": t} for i, (s, t) in enumerate(zip(src, tgt))]
        rows[1]["document"] = "first part\nsecond part\r\nthird"
        src[1] = "first part second part third"
        with open(raw / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=split == "train") + "\n")
        (raw / f"{split}.document").write_text("".join(s + "\n" for s in src), encoding="utf-8")
        (raw / f"{split}.summary").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    return raw


def _argv(raw, dest, *extra):
    return [
        "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--destdir", str(dest),
        "--source-lang", "document", "--target-lang", "summary", "--spm-vocab-size", "300", "--no-progress-bar",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_jsonl_equals_line_files_byte_for_byte_any_workers(corpus, tmp_path):
    main(_argv(corpus, tmp_path / "lines"))
    main(_argv(corpus, tmp_path / "j1", "--jsonl", "--workers", "1"))
    # explicit keys (here the same as the langs), 2 workers
    main(_argv(corpus, tmp_path / "j2", "--jsonl", "--workers", "2", "--source-key", "document",
               "--target-key", "summary"))  # fmt: skip
    lines = _data_files(tmp_path / "lines")
    assert {"train.document-summary.document.bin", "valid.document-summary.summary.idx"} <= set(lines)
    assert _data_files(tmp_path / "j1") == lines
    assert _data_files(tmp_path / "j2") == lines
    assert not [n for n in os.listdir(tmp_path / "j2") if n.startswith(".")]  # no temporary folder left


def test_keys_other_than_lang_names(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.jsonl").write_text(
        '{"article": "a b c", "highlights": "b"}\n{"article": "c a", "highlights": "a c"}\n'
    )
    main(["--trainpref", str(raw / "train"), "--destdir", str(tmp_path / "out"), "--jsonl", "--source-key",
          "article", "--target-key", "highlights", "--tokenizer", "none", "--no-progress-bar"])  # fmt: skip
    summary = json.loads((tmp_path / "out" / "preprocess.json").read_text())
    assert summary["splits"]["train"]["source"]["examples"] == 2
    assert summary["splits"]["train"]["target"]["tokens"] == 2 + 3  # "b" + eos, "a c" + eos


GOOD = '{"document": "x y", "summary": "y"}\n'


@pytest.mark.parametrize(
    "text,message",
    [
        (
            GOOD + '{"document": "x", "summary": "y"\n',
            r"train.jsonl:2: invalid JSON \(Expecting ',' delimiter",
        ),
        (GOOD + '{"document": "x"}\n', r"train.jsonl:2: no key 'summary' \(the object has 'document'"),
        (
            GOOD + GOOD + '{"document": 3, "summary": "y"}\n',
            r"train.jsonl:3: 'document' is int, expected a string",
        ),
        (GOOD + '{"document": " \\t ", "summary": "y"}\n', r"train.jsonl:2: 'document' is empty"),
        (GOOD + "\n" + GOOD, r"train.jsonl:2: empty line"),
        ('["x", "y"]\n', r"train.jsonl:1: expected a JSON object, got list"),
        (b'{"document": "\xff", "summary": "y"}\n', r"train.jsonl:1: invalid UTF-8 \(byte 0xff at byte 15"),
        ("", r"train.jsonl: file is empty"),
        # issue 31: json.loads recursed into a RecursionError traceback; a 5,000-digit integer hit Python's
        # int-str limit (a bare ValueError, then an AttributeError on its missing .msg)
        (
            GOOD + '{"document": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            r"train.jsonl:2: nested more than 100",
        ),
        (GOOD + '{"id": ' + "7" * 5000 + "}\n", r"train.jsonl:2: an integer of 5000 digits \(at most 100\)"),
    ],
)
def test_bad_jsonl_is_one_clear_error_and_writes_nothing(tmp_path, text, message):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.jsonl").write_bytes(text if isinstance(text, bytes) else text.encode())
    dest = tmp_path / "out"
    with pytest.raises(SeqtrainError, match=message) as e:
        main(["--trainpref", str(raw / "train"), "--destdir", str(dest), "--jsonl", "--source-lang", "document",
              "--target-lang", "summary", "--tokenizer", "none", "--no-progress-bar"])  # fmt: skip
    assert "\n" not in str(e.value)
    assert not dest.exists()


def test_jsonl_flag_errors(tmp_path):
    with pytest.raises(SeqtrainError, match="--source-key / --target-key need --jsonl"):
        main(["--trainpref", str(tmp_path / "t"), "--source-key", "document", "--tokenizer", "none"])
    with pytest.raises(SeqtrainError, match=r"input file not found: .*nope.jsonl"):
        main(["--trainpref", str(tmp_path / "nope"), "--jsonl", "--tokenizer", "none",
              "--destdir", str(tmp_path / "o")])  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_value_that_tokenizes_to_nothing_is_named_by_its_jsonl_line(corpus, tmp_path, workers):
    """A value sentencepiece drops whole (a control character) is reported at PREFIX.jsonl:LINE; before (issue
    31) the line was named in the run's temporary line file,
    DEST/.preprocess-PID@HOST.XXXX/jsonl-text/train.document:4, which is gone when the error is read."""
    rows = (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()
    rows[3] = json.dumps({"document": "\x01", "summary": "a summary"})
    (corpus / "train.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    dest = tmp_path / "out"
    with pytest.raises(SeqtrainError) as e:
        main(_argv(corpus, dest, "--jsonl", "--workers", workers))
    assert str(e.value) == (
        f"{corpus / 'train'}.jsonl:4: its 'document' value tokenizes to nothing (no token besides </s>): an "
        "empty example; remove the pair from both sides"
    )
    assert not dest.exists()
