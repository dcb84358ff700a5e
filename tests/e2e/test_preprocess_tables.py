"""seqtrain-preprocess --parquet / --load-from-disk: the pairs of a parquet file or a `datasets` save_to_disk
folder give byte for byte the data-bin of the same pairs as line files; bad tables are one line naming the file
(and row), writing nothing."""

from __future__ import annotations

import json
import os

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain_cli.preprocess import preprocess_main as main
from tests.e2e.test_preprocess_jsonl import _data_files

pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (pip install 'seqtrain[data]')")
import pyarrow.ipc  # noqa: E402,F401  (after the skip: pyarrow is an optional extra; pa.ipc below)
import pyarrow.parquet as pq  # noqa: E402

try:
    import datasets
except ImportError:  # the folder is then written with pyarrow in save_to_disk's layout (see _save_to_disk)
    datasets = None


def _save_to_disk(rows: dict, folder, shards: int = 2) -> None:
    """A save_to_disk folder of `rows`: by the `datasets` package when installed, else the same layout by hand
    (state.json listing Arrow IPC stream files in order; `datasets.load_from_disk` reads it back)."""
    if datasets is not None:
        datasets.Dataset.from_dict(rows).save_to_disk(str(folder), num_shards=shards)
        return
    table = pa.table(rows)
    os.makedirs(folder)
    names, n, per = [], table.num_rows, -(-table.num_rows // shards)
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        with pa.ipc.new_stream(str(folder / name), table.schema) as w:
            w.write_table(table.slice(k * per, min(per, n - k * per)), max_chunksize=7)
        names.append(name)
    state = {"_data_files": [{"filename": f} for f in names], "_fingerprint": "0" * 16, "_format_columns": None,
             "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None}  # fmt: skip
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text("{}")  # load_from_disk needs the file; the reader here does not


@pytest.fixture
def corpus(tmp_path, sample_dir):
    """120/30 pairs of the bundled sample as line files, a parquet file and a save_to_disk folder per split; one
    document holds line breaks, which the line files have as spaces; an extra integer column is ignored."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 120), ("valid", 30)):
        src = open(sample_dir / f"{split}.source", encoding="utf-8").read().splitlines()[:n]
        tgt = open(sample_dir / f"{split}.target", encoding="utf-8").read().splitlines()[:n]
        rows = {"id": list(range(n)), "article": list(src), "highlights": list(tgt)}
        rows["article"][1] = "first part\nsecond part\r\nthird"
        src[1] = "first part second part third"
        pq.write_table(pa.table(rows), raw / f"{split}.parquet", row_group_size=50)
        _save_to_disk(rows, raw / split)
        (raw / f"{split}.document").write_text("".join(s + "\n" for s in src), encoding="utf-8")
        (raw / f"{split}.summary").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    return raw


def _argv(raw, dest, *extra):
    return [
        "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--destdir", str(dest),
        "--source-lang", "document", "--target-lang", "summary", "--spm-vocab-size", "200", "--no-progress-bar",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_parquet_and_save_to_disk_equal_line_files_byte_for_byte(corpus, tmp_path):
    keys = ("--source-key", "article", "--target-key", "highlights")
    main(_argv(corpus, tmp_path / "lines"))
    main(_argv(corpus, tmp_path / "pq", "--parquet", *keys))
    main(_argv(corpus, tmp_path / "disk", "--load-from-disk", "--workers", "2", *keys))
    lines = _data_files(tmp_path / "lines")
    assert {"train.document-summary.document.bin", "valid.document-summary.summary.idx"} <= set(lines)
    assert _data_files(tmp_path / "pq") == lines
    assert _data_files(tmp_path / "disk") == lines
    summary = json.loads((tmp_path / "disk" / "preprocess.json").read_text())
    assert summary["splits"]["valid"]["document"]["examples"] == 30
    assert summary["splits"]["train"]["document"]["input"] == str(corpus / "train")


def _run(raw, fmt, *extra):
    main(["--trainpref", str(raw / "train"), "--destdir", str(raw.parent / "out"), fmt, "--source-lang",
          "document", "--target-lang", "summary", "--tokenizer", "none", "--no-progress-bar", *extra])  # fmt: skip


@pytest.mark.parametrize(
    "rows, message",
    [
        ({"document": ["a b", None], "summary": ["x", "y"]}, r"train{ext}:2: 'document' is null"),
        ({"document": ["a b", "c", " \t"], "summary": ["x", "y", "z"]}, r"train{ext}:3: 'document' is empty"),
        (
            {"text": ["a b"], "summary": ["x"]},
            r"train{fext}: no column 'document' \(the table has 'text', 'summary'",
        ),
        (
            {"document": [1, 2], "summary": ["x", "y"]},
            r"train{fext}: column 'document' holds int64, expected strings",
        ),
        ({"document": [], "summary": []}, r"train{ext}: no rows"),
    ],
)
@pytest.mark.parametrize("fmt", ["--parquet", "--load-from-disk"])
def test_bad_table_is_one_clear_error_and_writes_nothing(tmp_path, fmt, rows, message):
    raw = tmp_path / "raw"
    raw.mkdir()
    if fmt == "--parquet":
        table = pa.table(rows, schema=None if rows.get("document", 1) else pa.schema([("document", pa.string()),
                                                                               ("summary", pa.string())]))  # fmt: skip
        pq.write_table(table, raw / "train.parquet")
        ext = fext = ".parquet"
    else:
        _save_to_disk(rows, raw / "train", shards=1)
        ext, fext = "", "/data-00000-of-00001.arrow"
    with pytest.raises(SeqtrainError, match=message.format(ext=ext, fext=fext)) as e:
        _run(raw, fmt)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_folder_and_flag_errors(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    if datasets is None:
        pytest.skip("a DatasetDict folder is made with the datasets package, which is not installed")
    d = datasets.Dataset.from_dict({"document": ["a"], "summary": ["b"]})
    datasets.DatasetDict({"train": d, "validation": d}).save_to_disk(str(raw / "all"))
    with pytest.raises(
        SeqtrainError, match=r"all: a DatasetDict folder; give one split's folder as the prefix "
    ):
        main(["--trainpref", str(raw / "all"), "--load-from-disk", "--tokenizer", "none",
              "--destdir", str(tmp_path / "o")])  # fmt: skip
    with pytest.raises(SeqtrainError, match=r"input file not found: .*nope.parquet"):
        main(
            [
                "--trainpref",
                str(raw / "nope"),
                "--parquet",
                "--tokenizer",
                "none",
                "--destdir",
                str(tmp_path / "o"),
            ]
        )
    with pytest.raises(SeqtrainError, match="--jsonl and --parquet: choose one input format"):
        main(["--trainpref", str(raw / "t"), "--jsonl", "--parquet", "--tokenizer", "none"])
    # one of its split folders is read
    _run(raw / "all", "--load-from-disk")
    assert (raw / "out" / "train.document-summary.summary.bin").is_file()


def test_missing_pyarrow_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"document": ["a"], "summary": ["b"]}), raw / "train.parquet")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    with pytest.raises(SeqtrainError) as e:
        _run(raw, "--parquet")
    assert str(e.value) == (
        "--parquet needs pyarrow, which is not installed: pip install 'seqtrain[data]' (or pip install pyarrow)"
    )
    assert not (tmp_path / "out").exists()


def _strings(values: list, kind) -> pa.Array:
    """A string column holding exactly these bytes, valid UTF-8 or not (pyarrow checks nothing it is given as
    buffers: a table another tool wrote with a lone surrogate's bytes reads the same)."""
    binary = pa.array(values, type=pa.large_binary() if kind == pa.large_string() else pa.binary())
    return pa.Array.from_buffers(kind, len(values), binary.buffers())


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
@pytest.mark.parametrize("fmt", ["--parquet", "--load-from-disk"])
def test_invalid_utf8_in_a_string_column_is_one_line_naming_row_and_key(tmp_path, fmt, kind):
    """Issue 48, class 4: pyarrow's conversion raised a UnicodeDecodeError traceback; the line and jsonl readers
    refuse the same text in one line. The row is counted over the whole split (past the first record batch)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    docs = [f"doc {i}".encode() for i in range(1030)]
    docs[1026] = b"ab\xed\xa0\x80c"  # U+D800's bytes (a lone surrogate written as if it were text)
    rows = {"document": _strings(docs, kind), "summary": pa.array(["s"] * 1030, type=kind)}
    if fmt == "--parquet":
        pq.write_table(pa.table(rows), raw / "train.parquet")
        where = raw / "train.parquet"
    else:
        _save_to_disk(rows, raw / "train", shards=1)
        where = raw / "train"
    with pytest.raises(SeqtrainError) as e:
        _run(raw, fmt)
    assert str(e.value) == (
        f"{where}:1027: 'document' holds invalid UTF-8 (byte 0xed at byte 3 of the value), which is no text"
    )
    assert not (tmp_path / "out").exists()
