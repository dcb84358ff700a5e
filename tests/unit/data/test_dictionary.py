import io
import os

import pytest
import torch

from seqtrain.data.dictionary import (
    Dictionary,
    add_file_to_dictionary,
    count_chunk,
    find_offsets,
    iter_lines,
    post_process,
)
from seqtrain.errors import SeqtrainError


def make_dict(counts):
    d = Dictionary()
    for w, n in counts:
        d.add_symbol(w, n)
    return d


def test_specials_are_fairseqs():
    d = Dictionary()
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    assert d.symbols == ["<s>", "<pad>", "</s>", "<unk>"] and len(d) == 4 and d.nspecial == 4
    assert d.index("nope") == 3 and d[99] == "<unk>" and "<pad>" in d and "nope" not in d


def test_finalize_orders_by_count_then_symbol_and_pads():
    d = make_dict([("b", 5), ("a", 5), ("c", 9), ("d", 1), ("e", 5)])
    d.finalize(padding_factor=8)
    assert d.symbols == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "c",
        "a",
        "b",
        "e",
        "d",
        "madeupword0000",
        "madeupword0001",
        "madeupword0002",
        "madeupword0003",
        "madeupword0004",
        "madeupword0005",
        "madeupword0006",
    ]
    assert len(d) == 16 and d.count[4:9] == [9, 5, 5, 5, 1] and d.count[9:] == [0] * 7
    assert d.index("madeupword0003") == 12

    no_pad = make_dict([("b", 5), ("a", 5), ("c", 9)])
    no_pad.finalize(padding_factor=1)
    assert no_pad.symbols[4:] == ["c", "a", "b"]


def test_finalize_threshold_and_nwords():
    counts = [(f"w{i}", 10 - i) for i in range(10)]  # w0:10 .. w9:1
    d = make_dict(counts)
    d.finalize(threshold=7, padding_factor=1)
    assert d.symbols[4:] == ["w0", "w1", "w2", "w3"]  # counts 10, 9, 8, 7
    d = make_dict(counts)
    d.finalize(nwords=6, padding_factor=1)  # nwords counts the 4 specials, as in fairseq
    assert d.symbols[4:] == ["w0", "w1"]
    d = make_dict(counts)
    d.finalize(nwords=6, padding_factor=4)
    assert d.symbols[4:] == ["w0", "w1", "madeupword0000", "madeupword0001"]


def test_save_load_round_trip_and_exact_file(tmp_path):
    d = make_dict([("hello", 3), ("wörld", 2), ("x", 1)])
    d.finalize(padding_factor=8)
    path = tmp_path / "dict.txt"
    d.save(str(path))
    assert path.read_text(encoding="utf-8") == ("hello 3\nwörld 2\nx 1\nmadeupword0000 0\n")
    back = Dictionary.load(str(path))
    assert back == d and back.count == [1, 1, 1, 1, 3, 2, 1, 0]
    assert os.listdir(tmp_path) == ["dict.txt"]  # atomic write left no temp file
    assert Dictionary.from_list(d.to_list()) == d
    assert Dictionary.from_list(d.to_list()).to_list() == d.to_list()


def test_overwrite_flag(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a 5\nb 3\na 7 #fairseq:overwrite\n<s> 1 #fairseq:overwrite\n", encoding="utf-8")
    d = Dictionary.load(str(path))
    assert d.symbols == ["<s>", "<pad>", "</s>", "<unk>", "a", "b", "a", "<s>"]
    assert d.index("a") == 6 and d.index("<s>") == 7 and d.bos() == 0 and d.count[6] == 7
    d.save(str(tmp_path / "again.txt"))
    assert (tmp_path / "again.txt").read_text() == path.read_text()
    assert Dictionary.load(str(tmp_path / "again.txt")) == d


@pytest.mark.parametrize(
    "content,lineno",
    [
        ("a 1\nb\n", 2),
        ("a 1\nb 2\nc x\n", 3),
        ("a 1\n\nb 2\n", 2),
        ("a 1\na 2\n", 2),  # duplicate without the overwrite flag
        ("a 1 #fairseq:overwrite\nb 1.5\n", 2),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, content, lineno):
    path = tmp_path / "dict.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SeqtrainError, match=rf"dict\.txt:{lineno}: "):
        Dictionary.load(str(path))


def test_load_errors_missing_and_bad_encoding(tmp_path):
    with pytest.raises(SeqtrainError, match="nothere.txt: dictionary file not found"):
        Dictionary.load(str(tmp_path / "nothere.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a 1\n\xff\xfe 2\n")
    with pytest.raises(SeqtrainError, match=r"bad.txt:2: invalid UTF-8 \(byte 0xff at byte 1 of the line\)"):
        Dictionary.load(str(bad))


def test_bart_style_dict_indices():
    # Released BART dict.txt: GPT-2 BPE ids as strings, in frequency order; bart.large adds <mask> after loading.
    text = "13 850314647\n262 800385005\n11 800251374\n284 432911125\n"
    d = Dictionary.load(io.StringIO(text))
    assert [d.index(s) for s in ("13", "262", "11", "284")] == [4, 5, 6, 7]
    mask = d.add_symbol("<mask>")
    assert mask == 8 and len(d) == 9
    assert d.encode_line("262 13 99999").tolist() == [5, 4, 3, 2]


def test_encode_line_and_string():
    d = make_dict([("▁he", 1), ("llo", 1), ("▁w", 1)])
    ids = d.encode_line("▁he llo  ▁w zzz")
    assert ids.dtype == torch.int32 and ids.tolist() == [4, 5, 6, 3, 2]
    seen = []
    assert d.encode_line(
        ["▁he", "llo"], append_eos=False, consumer=lambda w, i: seen.append((w, i))
    ).tolist() == [4, 5]
    assert seen == [("▁he", 4), ("llo", 5)] and d.encode_line("").tolist() == [2]
    assert len(d) == 7  # add_if_not_exist defaults to False
    assert d.encode_line("new", add_if_not_exist=True).tolist() == [7, 2] and d.index("new") == 7
    t = torch.tensor([0, 4, 5, 6, 3, 2, 1, 1])
    assert d.string(t) == "▁he llo ▁w <unk>"
    assert d.string(t, include_eos=True) == "▁he llo ▁w <unk> </s>"
    assert d.string(t, extra_symbols_to_ignore=[3]) == "▁he llo ▁w"
    assert d.string(torch.tensor([4, 5, 6, 2]), bpe_symbol="sentencepiece") == "hello w"
    assert d.string(torch.stack([t[:4], t[:4]])) == "▁he llo ▁w\n▁he llo ▁w"
    assert post_process("a@@ b c@@ d", "@@ ") == "ab cd"


def test_fixture_dictionary_matches_fairseq(fairseq_tiny, tmp_path):
    ref = (fairseq_tiny / "data-bin" / "dict.src.txt").read_text(encoding="utf-8")
    for workers in (1, 3):
        d = Dictionary()
        for lang in ("src", "tgt"):  # fairseq-preprocess --joined-dictionary counted both sides
            add_file_to_dictionary(str(fairseq_tiny / "raw" / f"train.{lang}"), d, num_workers=workers)
        d.finalize(threshold=0, padding_factor=8)
        d.save(str(tmp_path / "dict.txt"))
        assert (tmp_path / "dict.txt").read_text(encoding="utf-8") == ref
    loaded = Dictionary.load(str(fairseq_tiny / "data-bin" / "dict.src.txt"))
    assert len(loaded) == 208 and loaded == d
    assert [loaded.index(s) for s in ("w18", "w148", "w99", "madeupword0000")] == [4, 5, 203, 204]


def test_fixture_binarized_tokens_decode_to_raw_text(fairseq_tiny):
    from seqtrain.data.indexed_dataset import MMapIndexedDataset

    d = Dictionary.load(str(fairseq_tiny / "data-bin" / "dict.src.txt"))
    ds = MMapIndexedDataset(str(fairseq_tiny / "data-bin" / "valid.src-tgt.src"))
    raw = (fairseq_tiny / "raw" / "valid.src").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(ds) == len(raw) == 200
    for i in range(len(ds)):
        assert ds[i][-1].item() == d.eos()
        assert d.string(ds[i]) == raw[i]


def test_chunked_counting_is_chunking_independent(tmp_path):
    path = tmp_path / "text.txt"
    lines = ["a b c", "", "b\rc  d\u2028e", "é ü a", "x" * 50, "last no newline"]
    path.write_bytes("\n".join(lines).encode("utf-8"))
    assert list(iter_lines(str(path))) == lines  # only '\n' ends a line
    single = count_chunk(str(path))
    assert single["</s>"] == 6 and single["a"] == 2 and single["b"] == 2
    for n in (1, 2, 3, 5, 16, 100):
        offs = find_offsets(str(path), n)
        assert len(offs) == n + 1 and offs[0] == 0 and offs[-1] == path.stat().st_size
        assert offs == sorted(offs)
        got = []
        total = count_chunk(str(path), offs[0], offs[1])
        got += list(iter_lines(str(path), offs[0], offs[1]))
        for a, b in zip(offs[1:], offs[2:]):
            got += list(iter_lines(str(path), a, b))
            total += count_chunk(str(path), a, b)
        assert got == lines and total == single


def test_add_file_to_dictionary_with_workers_equals_single(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"w{i % 7} w{i % 3} w{i % 11}\n" for i in range(300)), encoding="utf-8")
    from seqtrain.data.tokenizer import WhitespaceTokenizer

    dicts = []
    for workers, tokenize in ((1, None), (2, None), (2, WhitespaceTokenizer().encode)):
        d = Dictionary()
        Dictionary.add_file_to_dictionary(str(path), d, tokenize, workers)  # fairseq's spelling
        d.finalize()
        dicts.append(d)
    assert dicts[0] == dicts[1] == dicts[2] and dicts[0].count == dicts[1].count == dicts[2].count
    assert dicts[0].symbols[4:8] == ["w0", "w1", "w2", "w3"] and dicts[0].count[4] == 43 + 100 + 28
    assert dicts[0].count[dicts[0].eos()] == 301  # 1 from construction + one per line


def test_invalid_utf8_in_text_names_file_and_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"ok\nbad \xff\n")
    with pytest.raises(SeqtrainError, match=r"t\.txt:2: invalid UTF-8 \(byte 0xff at byte 5 of the line\)"):
        count_chunk(str(path))
