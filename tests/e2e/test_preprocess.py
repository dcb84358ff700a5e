import json
import os
import pathlib
import subprocess
import sys
from collections import Counter

import pytest

import seqtrain.preprocess.databin as P
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.indexed_dataset import MMapIndexedDataset, recorded_max_id
from seqtrain.data.tokenizer import load_databin_tokenizer
from seqtrain.errors import SeqtrainError
from seqtrain_cli.preprocess import preprocess_main as main

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def write_pair(folder, prefix, src_lines, tgt_lines, src="source", tgt="target"):
    for lang, lines in ((src, src_lines), (tgt, tgt_lines)):
        data = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode("utf-8")
        (folder / f"{prefix}.{lang}").write_bytes(data)
    return str(folder / prefix)


def snapshot(folder):
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))} if folder.exists() else None


@pytest.fixture
def small_sample(tmp_path, sample_dir):
    """The first 500 train and 100 valid/test pairs of the bundled sample."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 500), ("valid", 100), ("test", 100)):
        for lang in ("source", "target"):
            with open(sample_dir / f"{split}.{lang}", "rb") as f:
                (raw / f"{split}.{lang}").write_bytes(b"".join(next(f) for _ in range(n)))
    return raw


def sample_argv(raw, dest, *extra):
    return [
        "--trainpref",
        str(raw / "train"),
        "--validpref",
        str(raw / "valid"),
        "--testpref",
        str(raw / "test"),
        "--destdir",
        str(dest),
        "--spm-vocab-size",
        "500",
        "--no-progress-bar",
        *extra,
    ]


def test_worker_pool_ends_whatever_sigterm_handler_its_workers_inherit(small_sample, tmp_path):
    """The preprocessing workers are forked inside the work folder's context, whose Python-level SIGTERM
    handler they would inherit; such a handler runs between bytecodes, can be swallowed (raised inside a
    __del__), and a worker that survives keeps the pool's join waiting for ever (the suite hung so once, in
    test_worker_counts_give_identical_bytes_and_data_reads_back). The workers ignore SIGTERM and SIGINT
    (seqtrain.workers.child_pool) and Pool.terminate ends them with SIGKILL, so preprocessing ends
    whatever handler they inherited."""
    code = (
        "import sys, seqtrain.preprocess.scratch as scratch\n"
        "scratch._terminate = lambda signum, frame: None  # the handler the workers inherit: ignores SIGTERM\n"
        "from seqtrain_cli.preprocess import preprocess_main\n"
        "print(sorted(preprocess_main(sys.argv[1:])['splits']))\n"
    )
    argv = sample_argv(small_sample, tmp_path / "out", "--workers", "2")
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "['test', 'train', 'valid']"


# --- compatibility and determinism ------------------------------------------------------------------------------
@pytest.mark.slow
def test_tokenizer_none_matches_fairseq_preprocess_byte_for_byte(fairseq_tiny, tmp_path):
    raw = fairseq_tiny / "raw"
    dest = tmp_path / "bin"
    main(
        [
            "-s",
            "src",
            "-t",
            "tgt",
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--testpref",
            str(raw / "test"),
            "--destdir",
            str(dest),
            "--joined-dictionary",
            "--tokenizer",
            "none",
            "--workers",
            "2",
            "--no-progress-bar",
        ]
    )
    theirs = sorted(os.listdir(fairseq_tiny / "data-bin"))
    assert len(theirs) == 14
    for name in theirs:
        assert (dest / name).read_bytes() == (fairseq_tiny / "data-bin" / name).read_bytes(), name
    summary = json.loads((dest / "preprocess.json").read_text())
    # fairseq's own log of that run: "train.src: 3000 sents, 29869 tokens, 0.0% replaced"
    assert summary["splits"]["train"]["src"]["examples"] == 3000
    assert summary["splits"]["train"]["src"]["tokens"] == 29869
    assert summary["splits"]["test"]["src"]["tokens"] == 2050
    assert summary["splits"]["valid"]["tgt"]["tokens"] == 1200


@pytest.mark.slow
def test_worker_counts_give_identical_bytes_and_data_reads_back(small_sample, tmp_path):
    outs = {}
    for w in (1, 2):
        dest = tmp_path / f"w{w}"
        assert main(sample_argv(small_sample, dest, "--workers", str(w)))["splits"]
        outs[w] = dest
    files = sorted(n for n in os.listdir(outs[1]) if n != "preprocess.json")
    assert files == sorted(n for n in os.listdir(outs[2]) if n != "preprocess.json")
    assert {
        "spm.model",
        "tokenizer.json",
        "dict.source.txt",
        "dict.target.txt",
        "test.source-target.target.idx",
    } <= set(files)
    for name in files:
        assert (outs[1] / name).read_bytes() == (outs[2] / name).read_bytes(), name
    s1, s2 = (json.loads((outs[w] / "preprocess.json").read_text()) for w in (1, 2))
    assert s1["splits"] == s2["splits"] and s1["args"]["workers"] == 1 and s2["args"]["workers"] == 2

    # Read the data-bin back: every item is the dictionary encoding of the tokenized input line.
    tok = load_databin_tokenizer(str(outs[2]))
    assert tok.kind == "sentencepiece"
    for split, n in (("train", 500), ("valid", 100)):
        for lang in ("source", "target"):
            d = Dictionary.load(str(outs[2] / f"dict.{lang}.txt"))
            ds = MMapIndexedDataset(str(outs[2] / f"{split}.source-target.{lang}"))
            lines = (small_sample / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
            assert len(ds) == len(lines) == n
            for i, line in enumerate(lines):
                assert ds[i].tolist() == d.encode_line(tok.encode(line)).tolist()
            assert ds[0][-1].item() == d.eos() and (ds[0] != d.unk()).all()
            assert s2["splits"][split][lang]["examples"] == n
            assert s2["splits"][split][lang]["tokens"] == int(ds.sizes.sum())
            assert s2["splits"][split][lang]["length"]["max"] == int(ds.sizes.max())


def test_summary_figures_on_hand_made_corpus(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b c", "a b", "a", "b c d e"], ["x", "x y", "y", "z"])
    write_pair(raw, "valid", ["a q q", "b"], ["x", "w"])
    dest = tmp_path / "bin"
    main(
        [
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--destdir",
            str(dest),
            "--tokenizer",
            "none",
            "--thresholdsrc",
            "2",
            "--no-progress-bar",
        ]
    )
    # counts a3 b3 c2 d1 e1; threshold 2 drops d and e; 4 specials + 3 symbols padded to 8
    assert (dest / "dict.source.txt").read_text() == "a 3\nb 3\nc 2\nmadeupword0000 0\n"
    assert (dest / "dict.target.txt").read_text() == "x 2\ny 2\nz 1\nmadeupword0000 0\n"
    s = json.loads((dest / "preprocess.json").read_text())["splits"]
    assert s["train"]["source"] == {
        "input": str(raw / "train.source"),
        "examples": 4,
        "tokens": 14,
        "unk": 2,
        "max_id": 6,  # 'c', the last of a b c after the 4 specials
        "unk_rate": 2 / 14,
        "length": {"p50": 3, "p90": 5, "p95": 5, "p99": 5, "max": 5},
    }
    assert s["valid"]["source"]["tokens"] == 6 and s["valid"]["source"]["unk"] == 2
    assert s["valid"]["target"]["unk"] == 1 and s["valid"]["target"]["unk_rate"] == 0.25
    assert s["train"]["target"]["length"] == {"p50": 2, "p90": 3, "p95": 3, "p99": 3, "max": 3}
    out = capsys.readouterr().out
    assert "train  source         4      14  14.29%    3    5    5    5    5" in out
    assert "valid  target         2       4  25.00%" in out


def test_length_percentiles_nearest_rank():
    hist = Counter({i: 1 for i in range(1, 101)})
    assert P.length_percentiles(hist) == {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "max": 100}
    assert P.length_percentiles(Counter({7: 3})) == {"p50": 7, "p90": 7, "p95": 7, "p99": 7, "max": 7}


def test_given_dictionary_multiple_valid_splits_and_dict_only(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    write_pair(raw, "v1", ["a"], ["x"])
    write_pair(raw, "v2", ["c c"], ["y"])
    (tmp_path / "given.txt").write_text("c 10\na 5\n")
    dest = tmp_path / "bin"
    main(
        [
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            f"{raw / 'v1'},{raw / 'v2'}",
            "--destdir",
            str(dest),
            "--tokenizer",
            "none",
            "--srcdict",
            str(tmp_path / "given.txt"),
            "--no-progress-bar",
        ]
    )
    # a given dictionary is used as it is (no re-sorting, no padding), as fairseq does
    assert (dest / "dict.source.txt").read_text() == "c 10\na 5\n"
    assert MMapIndexedDataset(str(dest / "valid1.source-target.source"))[0].tolist() == [4, 4, 2]
    assert MMapIndexedDataset(str(dest / "valid.source-target.source"))[0].tolist() == [5, 2]
    assert MMapIndexedDataset(str(dest / "train.source-target.source"))[0].tolist() == [5, 3, 2]

    only = tmp_path / "dictonly"
    main(
        [
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(only),
            "--tokenizer",
            "none",
            "--joined-dictionary",
            "--dict-only",
            "--no-progress-bar",
        ]
    )
    assert sorted(os.listdir(only)) == [
        "dict.source.txt",
        "dict.target.txt",
        "preprocess.json",
        "tokenizer.json",
    ]
    assert (only / "dict.source.txt").read_text() == (only / "dict.target.txt").read_text()
    assert "x 1\n" in (only / "dict.source.txt").read_text()


# --- input validation -------------------------------------------------------------------------------------------
def test_scan_text_file_counts_and_finds_lines_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_READ_BLOCK", 5)  # lines straddle many blocks
    f = tmp_path / "f.txt"
    f.write_bytes("première ligne\nzwei\ndrei drei drei\nlast".encode())
    assert P.scan_text_file(str(f)) == 4
    f.write_bytes("one\ntwo two two\n\xc3\xa9\nthree\nfour \xe9 x\n".encode("latin-1"))
    with pytest.raises(SeqtrainError, match=r"f\.txt:5: invalid UTF-8 \(byte 0xe9 at byte 6 of the line\)"):
        P.scan_text_file(str(f))
    f.write_bytes(b"one\ntwo\n \t \nfour\n")
    with pytest.raises(SeqtrainError, match=r"f\.txt:3: empty line"):
        P.scan_text_file(str(f))
    f.write_bytes(b"")
    with pytest.raises(SeqtrainError, match=r"f\.txt: file is empty"):
        P.scan_text_file(str(f))


def test_line_chunks_cover_the_file_on_line_boundaries(tmp_path):
    f = tmp_path / "f.txt"
    data = b"".join(b"x" * (i % 7 + 1) + b"\n" for i in range(50)) + b"tail"
    f.write_bytes(data)
    for n in (1, 2, 3, 8, 100):
        chunks = P.line_chunks(str(f), n)
        assert chunks[0][0] == 0 and chunks[-1][1] == len(data)
        assert all(a < b and b == c for (a, b), (c, _) in zip(chunks, chunks[1:] + [(len(data), 0)]))
        assert all(data[a - 1 : a] == b"\n" for a, _ in chunks[1:])
        lines = [line for a, b in chunks for line in P.read_chunk(str(f), a, b)]
        assert lines == data.decode().split("\n")


BAD_INPUTS = {
    "missing": (
        lambda raw: (raw / "train.target").unlink(),
        r"--trainpref .*train: input file not found: .*train\.target",
    ),
    "mismatch": (
        lambda raw: (raw / "train.target").write_text("x\ny\n"),
        r"line count mismatch: .*train\.source has 3 lines but .*train\.target has 2",
    ),
    "empty_line": (lambda raw: (raw / "train.source").write_text("a\n\nc\n"), r"train\.source:2: empty line"),
    "bad_utf8": (
        lambda raw: (raw / "train.target").write_bytes(b"x\ny\nz \xff\n"),
        r"train\.target:3: invalid UTF-8 \(byte 0xff at byte 3 of the line\)",
    ),
    "bad_srcdict": (
        lambda raw: (raw / "dict.txt").write_text("a 1\nb\n"),
        r"dict\.txt:2: malformed dictionary line 'b'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, case):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c", "c"], ["x", "y", "z"])
    spoil, message = BAD_INPUTS[case]
    spoil(raw)
    dest = tmp_path / "bin"
    argv = [
        "--trainpref",
        str(raw / "train"),
        "--destdir",
        str(dest),
        "--tokenizer",
        "none",
        "--no-progress-bar",
    ]
    if case == "bad_srcdict":
        argv += ["--srcdict", str(raw / "dict.txt")]
    with pytest.raises(SeqtrainError, match=message) as e:
        main(argv)
    assert "\n" not in str(e.value)
    assert not dest.exists()


@pytest.mark.slow
def test_console_script_reports_error_line_and_exit_code(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a", "b"], ["x"])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "seqtrain_cli.preprocess",
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(tmp_path / "bin"),
            "--tokenizer",
            "none",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"seqtrain-preprocess: error: line count mismatch: {raw / 'train.source'} has 2 "
        f"lines but {raw / 'train.target'} has 1 (line i of each must belong together)"
    ]
    assert not (tmp_path / "bin").exists()


def test_destdir_with_a_different_dictionary_is_refused_identical_is_fine(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    dest = tmp_path / "bin"
    argv = [
        "--trainpref",
        str(raw / "train"),
        "--destdir",
        str(dest),
        "--tokenizer",
        "none",
        "--no-progress-bar",
    ]
    main(argv)
    first = snapshot(dest)
    main(argv)  # same input, same dictionary: fine, same bytes
    assert snapshot(dest) == first
    write_pair(raw, "train", ["a b", "b d"], ["x", "y"])
    with pytest.raises(SeqtrainError, match=r"bin/dict\.source\.txt already exists and differs"):
        main(argv)
    assert snapshot(dest) == first  # nothing replaced, no temp folder left behind


def test_rerun_with_other_dictionary_flags_is_refused_before_any_work(tmp_path, monkeypatch):
    """The README's own-data path as a user walked it: a data-bin with separate dictionaries, then the same
    --destdir again with --joined-dictionary. Refused at once, naming the flag, before the tokenizer is trained
    (45 s on the sample), and the data-bin stays as it was; other splits or workers are a fine rerun."""
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    write_pair(raw, "valid", ["a c"], ["y"])
    dest = tmp_path / "bin"
    argv = [
        "--trainpref",
        str(raw / "train"),
        "--destdir",
        str(dest),
        "--tokenizer",
        "none",
        "--no-progress-bar",
    ]
    main(argv)
    first = snapshot(dest)
    main(argv + ["--validpref", str(raw / "valid"), "--workers", "2"])  # adds a split: same dictionaries
    assert snapshot(dest)["dict.source.txt"] == first[
        "dict.source.txt"
    ] and "valid.source-target.source.bin" in snapshot(dest)
    second = snapshot(dest)

    def no_tokenizer(*a, **k):
        raise AssertionError("the tokenizer was built before the refusal")

    monkeypatch.setattr(P, "make_tokenizer", no_tokenizer)
    with pytest.raises(SeqtrainError) as e:
        main(argv + ["--joined-dictionary"])
    assert str(e.value) == (
        f"--destdir {dest} holds a data-bin made with other tokenizer/dictionary flags (--joined-dictionary "
        "given now, not before): its files cannot be mixed with the new ones. Remove that folder or choose "
        "another --destdir, then rerun (nothing was changed)"
    )
    with pytest.raises(
        SeqtrainError, match=r"\(--tokenizer none before, sentencepiece now; --joined-dictionary"
    ):
        main(argv[:-3] + ["--no-progress-bar", "--joined-dictionary"])
    assert snapshot(dest) == second


def test_failure_during_binarization_leaves_no_valid_looking_files(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    dest = tmp_path / "bin"
    dest.mkdir()
    (dest / "keep.txt").write_text("unrelated")

    def boom(self, *args):
        raise SeqtrainError("disk full (simulated)")

    monkeypatch.setattr(P.ChunkWorker, "binarize", boom)
    with pytest.raises(SeqtrainError, match="simulated"):
        main(
            [
                "--trainpref",
                str(raw / "train"),
                "--destdir",
                str(dest),
                "--tokenizer",
                "none",
                "--no-progress-bar",
            ]
        )
    assert os.listdir(dest) == ["keep.txt"]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "nothing to preprocess"),
        (["--trainpref", "x", "--workers", "0"], "argument --workers: must be between 1 and 1024, got 0"),
        (["--trainpref", "x", "-s", "en", "-t", "en"], "their files would collide"),
        (
            [
                "--trainpref",
                "x",
                "--joined-dictionary",
                "--srcdict",
                "a",
                "--tgtdict",
                "b",
                "--tokenizer",
                "none",
            ],
            "cannot use both --srcdict and --tgtdict with --joined-dictionary",
        ),
        (["--trainpref", "x", "--srcdict", "d.txt"], "pass the --spm-model it was made with"),
        (["--trainpref", "x", "--tokenizer", "gpt2"], "--tokenizer gpt2 needs --gpt2-encoder-json"),
        (["--validpref", "x", "--tokenizer", "none"], "--trainpref is needed to build the source dictionary"),
        (
            ["--trainpref", "x", "--tokenizer", "none", "--srcdict", "nope.txt"],
            "--srcdict: file not found: nope.txt",
        ),
    ],
)
def test_flag_errors(argv, message, tmp_path):
    with pytest.raises(SeqtrainError, match=message):
        main(argv + ["--destdir", str(tmp_path / "bin")])
    assert not (tmp_path / "bin").exists()


def test_destdir_that_is_a_file_is_a_clear_error(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a"], ["x"])
    (tmp_path / "bin").write_text("not a folder")
    with pytest.raises(SeqtrainError, match=r"--destdir .*bin: cannot create the folder"):
        main(["--trainpref", str(raw / "train"), "--destdir", str(tmp_path / "bin"), "--tokenizer", "none"])
    assert (tmp_path / "bin").read_text() == "not a folder"


def test_spm_vocab_too_large_is_a_clear_error(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    with pytest.raises(
        SeqtrainError, match=r"--spm-vocab-size 8000: sentencepiece training failed: .*too high"
    ):
        main(["--trainpref", str(raw / "train"), "--destdir", str(tmp_path / "bin"), "--no-progress-bar"])
    assert not (tmp_path / "bin").exists()


def _bytes_to_unicode():
    """GPT-2's printable stand-in for every byte (the byte-level BPE alphabet)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def test_gpt2_tokenizer_with_bart_style_given_dictionaries_and_only_source(tmp_path):
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    vocab["he"] = 256
    vocab["\u0120he"] = 257  # "Ġhe": " he" after byte-level mapping
    (tmp_path / "encoder.json").write_text(json.dumps(vocab))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nh e\n\u0120 he\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "train", ["he he", "hehe!"], ["he", "e"])
    # BART's dict.txt lists GPT-2 ids as decimal strings; 104 ("h") is missing here, so it becomes <unk>
    (tmp_path / "dict.txt").write_text("256 9\n257 8\n33 7\n101 6\n")
    dest = tmp_path / "bin"
    gpt2 = [
        "--tokenizer",
        "gpt2",
        "--gpt2-encoder-json",
        str(tmp_path / "encoder.json"),
        "--gpt2-vocab-bpe",
        str(tmp_path / "vocab.bpe"),
    ]
    main(
        [
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(dest),
            "--srcdict",
            str(tmp_path / "dict.txt"),
            "--tgtdict",
            str(tmp_path / "dict.txt"),
            "--no-progress-bar",
            *gpt2,
        ]
    )
    src = MMapIndexedDataset(str(dest / "train.source-target.source"))
    assert [src[i].tolist() for i in range(2)] == [[4, 5, 2], [4, 4, 6, 2]]  # "he", " he" / "he", "he", "!"
    assert MMapIndexedDataset(str(dest / "train.source-target.target"))[1].tolist() == [7, 2]
    assert {"encoder.json", "vocab.bpe", "tokenizer.json"} <= set(os.listdir(dest))
    assert load_databin_tokenizer(str(dest)).encode("hehe!") == "256 256 33"

    # --only-source without -s, as fairseq-preprocess: the input is PREFIX itself, the outputs have no language
    only = tmp_path / "only"
    main(
        [
            "--trainpref",
            str(raw / "train.source"),
            "--destdir",
            str(only),
            "--only-source",
            "--no-progress-bar",
            *gpt2,
        ]
    )
    assert (only / "dict.txt").read_text() == "256 3\n257 1\n33 1\nmadeupword0000 0\n"
    assert sorted(n for n in os.listdir(only) if n.endswith((".bin", ".idx"))) == ["train.bin", "train.idx"]
    assert sorted(n for n in os.listdir(only) if n.startswith("dict")) == ["dict.txt"]
    assert MMapIndexedDataset(str(only / "train"))[1].tolist() == [4, 4, 6, 2]
    # with -s, fairseq's {split}.{src}-None.{src} names
    named = tmp_path / "named"
    main(
        ["--trainpref", str(raw / "train"), "--destdir", str(named), "--only-source", "-s", "source"]
        + ["--no-progress-bar", *gpt2]
    )
    assert sorted(n for n in os.listdir(named) if n.endswith((".idx", ".txt"))) == [
        "dict.source.txt",
        "train.source-None.source.idx",
    ]


def test_only_source_keeps_blank_lines_as_document_breaks(tmp_path):
    # monolingual text for --task denoising: a blank line ends a document and is the item `</s>`, as in
    # fairseq-preprocess; the preprocess.json side is "source", and the token-id check finds it
    (tmp_path / "text").write_text("a b c\nb c\n\nc a\n", encoding="utf-8")
    dest = tmp_path / "bin"
    summary = main(["--only-source", "--trainpref", str(tmp_path / "text"), "--destdir", str(dest)]
                   + ["--tokenizer", "none", "--no-progress-bar"])  # fmt: skip
    ds = MMapIndexedDataset(str(dest / "train"))
    assert [ds[i].tolist() for i in range(len(ds))] == [[5, 6, 4, 2], [6, 4, 2], [2], [4, 5, 2]]
    assert (dest / "dict.txt").read_text() == "c 3\na 2\nb 2\nmadeupword0000 0\n"
    assert summary["splits"]["train"]["source"]["examples"] == 4
    assert recorded_max_id(str(dest / "train")) == 6


def test_an_output_never_replaces_an_input_but_the_same_bytes_may_be_rewritten(tmp_path):
    """Issue 48, class 1, preprocess's share: a data-bin file that is one of the inputs (here the source side
    named tokenizer.json in the --destdir itself) is refused before anything moves; a dictionary given from the
    --destdir itself (--srcdict bin/dict.source.txt --destdir bin) is rewritten with the same bytes, which
    loses nothing, and still works."""
    dest = tmp_path / "bin"
    dest.mkdir()
    write_pair(dest, "tokenizer", ["a b", "b c"], ["x", "y"])
    os.rename(dest / "tokenizer.source", dest / "tokenizer.json")
    before = snapshot(dest)
    with pytest.raises(SeqtrainError) as e:
        main(["--trainpref", str(dest / "tokenizer"), "-s", "json", "-t", "target", "--destdir", str(dest),
              "--tokenizer", "none", "--no-progress-bar"])  # fmt: skip
    assert str(e.value) == (
        f"--destdir {dest}/tokenizer.json is --trainpref {dest}/tokenizer.json (the same file): writing it would "
        "replace that input; give --destdir another file"
    )
    assert snapshot(dest) == before
    raw, d = tmp_path / "raw", tmp_path / "d"
    raw.mkdir()
    d.mkdir()
    write_pair(raw, "train", ["a b", "b c"], ["x", "y"])
    (d / "dict.source.txt").write_text("c 10\na 5\nb 1\n")
    argv = ["--trainpref", str(raw / "train"), "--srcdict", str(d / "dict.source.txt"), "--destdir", str(d),
            "--tokenizer", "none", "--no-progress-bar"]  # fmt: skip
    main(argv)
    main(argv)  # and again: the same bytes over the same file
    assert (d / "dict.source.txt").read_text() == "c 10\na 5\nb 1\n"
    assert (d / "train.source-target.source.idx").is_file()
