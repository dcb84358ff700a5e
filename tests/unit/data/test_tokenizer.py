import argparse
import json
import pickle

import pytest

from seqtrain.config import add_settings, from_args
from seqtrain.data.tokenizer import (
    GPT2BPETokenizer,
    SentencePieceTokenizer,
    TokenizerConfig,
    WhitespaceTokenizer,
    build_tokenizer,
    load_databin_tokenizer,
    load_tokenizer,
    save_databin_tokenizer,
)
from seqtrain.errors import SeqtrainError
from seqtrain.registry import TOKENIZERS
from tests.utils import SAMPLE

TRICKY = [
    "Hello world",
    " leading space",
    "it's they're we've I'm you'll he'd don't CAN'T",
    "multiple   spaces  between   words",
    "tabs\tand \t mixed",
    "émoji 😀🎉 naïve café 日本語のテキスト",
    "trailing spaces   ",
    "   ",
    "",
    "numbers 1234567 3.14 and $5,000!!",
    "a\u00a0nbsp and \u3000ideographic space",
    "<unk> <mask> literal markers",
    "x'S caps'LL 'd 'm",
]


def train_lines(sample_dir, n=2000):
    return (sample_dir / "train.target").read_text(encoding="utf-8").split("\n")[:n]


# --- none -----------------------------------------------------------------------------------------------------
def test_none_tokenizer():
    t = WhitespaceTokenizer()
    assert t.encode("  a  b\tc ") == "a b c" and t.decode("a  b c") == "a b c"
    assert build_tokenizer(json.loads(json.dumps(t.spec()))).encode("x  y") == "x y"
    assert build_tokenizer(None).spec() == {"kind": "none", "version": 1}
    assert set(TOKENIZERS.names()) >= {"none", "sentencepiece", "gpt2"}


# --- sentencepiece --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spm_tok(tmp_path_factory):
    return SentencePieceTokenizer.train([str(SAMPLE / "train.target")], vocab_size=600)


def test_spm_train_is_deterministic_and_round_trips(spm_tok, sample_dir):
    again = SentencePieceTokenizer.train([str(sample_dir / "train.target")], vocab_size=600)
    assert again.model_proto == spm_tok.model_proto and spm_tok.vocab_size == 600
    lines = (sample_dir / "valid.target").read_text(encoding="utf-8").split("\n")[:100]
    for line in lines:
        enc = spm_tok.encode(line)
        pieces = enc.split()
        assert all(" " not in p for p in pieces) and enc == " ".join(pieces)
        if line.isascii():
            assert spm_tok.decode(enc) == " ".join(line.split())
    assert spm_tok.encode_batch(lines[:10]) == [spm_tok.encode(x) for x in lines[:10]]
    assert spm_tok.encode("  game   for\u2028text ").startswith("▁game ▁for")


def test_spm_bpe_model_type(sample_dir):
    t = SentencePieceTokenizer.train([str(sample_dir / "train.target")], vocab_size=400, model_type="bpe")
    assert t.sp.GetPieceSize() == 400
    enc = t.encode("library for decoding streams")
    assert enc.split()[0].startswith("▁") and t.decode(enc) == "library for decoding streams"


def test_spm_spec_pickle_databin_and_file(spm_tok, tmp_path):
    text = "Play chess across 3 boards!"
    spec = json.loads(json.dumps(spm_tok.spec()))
    assert spec["kind"] == "sentencepiece"
    assert build_tokenizer(spec).encode(text) == spm_tok.encode(text)
    assert pickle.loads(pickle.dumps(spm_tok)).encode(text) == spm_tok.encode(text)
    save_databin_tokenizer(str(tmp_path), spm_tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "tokenizer.json"]
    assert load_databin_tokenizer(str(tmp_path)) == spm_tok
    assert SentencePieceTokenizer.from_file(str(tmp_path / "spm.model")).encode(text) == spm_tok.encode(text)


def test_spm_errors(sample_dir, tmp_path):
    with pytest.raises(SeqtrainError, match="Vocabulary size too high"):
        SentencePieceTokenizer.train([str(sample_dir / "valid.target")], vocab_size=50000)
    with pytest.raises(SeqtrainError, match="missing.txt: no such file"):
        SentencePieceTokenizer.train([str(tmp_path / "missing.txt")])
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(SeqtrainError, match="bad.model: not a valid sentencepiece model"):
        SentencePieceTokenizer.from_file(str(tmp_path / "bad.model"))


# --- gpt2 -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    """A small encoder.json / vocab.bpe pair in GPT-2's file format, learned with `tokenizers` (no download)."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    text = (SAMPLE / "train.target").read_text(encoding="utf-8").split("\n")[:2000]
    text += ["it's they're we've I'm you'll he'd don't", "café naïve 日本語 😀"] * 5
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        text, vocab_size=700, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False
    )
    bpe.save_model(str(folder))
    (folder / "vocab.json").rename(folder / "encoder.json")
    (folder / "merges.txt").rename(folder / "vocab.bpe")
    assert (folder / "vocab.bpe").read_text(encoding="utf-8").startswith("#version: 0.2\n")
    return folder / "encoder.json", folder / "vocab.bpe"


def reference_gpt2(encoder_json, vocab_bpe):
    """transformers' pure-Python GPT-2 BPE (CLVP's copy of the slow GPT2Tokenizer; v5 dropped the original),
    with CLVP's English text normalizer switched off so it is plain GPT-2."""
    clvp = pytest.importorskip("transformers.models.clvp.tokenization_clvp")

    class SlowGPT2(clvp.ClvpTokenizer):
        @property
        def normalizer(self):
            return lambda s: s

    ref = SlowGPT2(str(encoder_json), str(vocab_bpe))
    return lambda text: [ref.convert_tokens_to_ids(t) for t in ref._tokenize(text)]


@pytest.mark.slow
def test_gpt2_matches_python_reference_and_is_lossless(gpt2_files):
    tok = GPT2BPETokenizer.from_files(*map(str, gpt2_files))
    ref = reference_gpt2(*gpt2_files)
    for text in TRICKY:
        ids = ref(text)
        assert tok.encode(text) == " ".join(map(str, ids)), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch(TRICKY) == [tok.encode(t) for t in TRICKY]
    # many merges fire on real lines, so the comparison is not just byte by byte
    line = "utility library wrapping the Intel DSA sysfs ABI"
    assert len(ref(line)) < len(line.encode()) / 2 and tok.encode(line) == " ".join(map(str, ref(line)))
    # fairseq BART convention: symbols are decimal strings of GPT-2 ids
    assert all(s.isdigit() for s in tok.encode("Hello world").split())


def test_gpt2_decode_keeps_non_id_symbols(gpt2_files):
    tok = GPT2BPETokenizer.from_files(*map(str, gpt2_files))
    hi = tok.encode("Hi")
    assert tok.decode(f"{hi} <unk> {hi} madeupword0000 99999 ▁x") == "Hi<unk>Himadeupword000099999▁x"


def test_gpt2_spec_pickle_databin(gpt2_files, tmp_path):
    tok = GPT2BPETokenizer.from_files(*map(str, gpt2_files))
    text = TRICKY[5]
    spec = json.loads(json.dumps(tok.spec()))
    assert spec["encoder_json"] == gpt2_files[0].read_text(encoding="utf-8")
    assert build_tokenizer(spec).encode(text) == tok.encode(text)
    assert pickle.loads(pickle.dumps(tok)).encode(text) == tok.encode(text)
    save_databin_tokenizer(str(tmp_path), tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder.json", "tokenizer.json", "vocab.bpe"]
    assert (tmp_path / "vocab.bpe").read_bytes() == gpt2_files[1].read_bytes()
    assert load_databin_tokenizer(str(tmp_path)).encode(text) == tok.encode(text)


def test_gpt2_bad_files(gpt2_files, tmp_path):
    enc = gpt2_files[0].read_text(encoding="utf-8")
    with pytest.raises(SeqtrainError, match=r"vocab.bpe:3: malformed merge line 'a b c'"):
        GPT2BPETokenizer(enc, "#version: 0.2\nĠ t\na b c\n")
    with pytest.raises(SeqtrainError, match="encoder.json: invalid JSON"):
        GPT2BPETokenizer("{not json", "#version: 0.2\n")


# --- data-bin and flags ---------------------------------------------------------------------------------------
def test_databin_without_tokenizer_json_is_none(tmp_path):
    assert isinstance(load_databin_tokenizer(str(tmp_path)), WhitespaceTokenizer)
    (tmp_path / "tokenizer.json").write_text("{oops", encoding="utf-8")
    with pytest.raises(SeqtrainError, match="tokenizer.json: not valid JSON"):
        load_databin_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"kind": "wordpiece"}', encoding="utf-8")
    with pytest.raises(SeqtrainError, match="tokenizer.json: unknown tokenizer 'wordpiece'"):
        load_databin_tokenizer(str(tmp_path))


def test_load_tokenizer(gpt2_files, sample_dir):
    def tokenizer_config(args):
        return from_args(TokenizerConfig, args)

    p = argparse.ArgumentParser()
    add_settings(p, TokenizerConfig)
    args = p.parse_args(
        [
            "--tokenizer",
            "gpt2",
            "--gpt2-encoder-json",
            str(gpt2_files[0]),
            "--gpt2-vocab-bpe",
            str(gpt2_files[1]),
        ]
    )
    assert load_tokenizer(tokenizer_config(args)).encode("Hello") == GPT2BPETokenizer.from_files(
        *map(str, gpt2_files)
    ).encode("Hello")
    with pytest.raises(SeqtrainError, match="--tokenizer gpt2 needs --gpt2-encoder-json"):
        load_tokenizer(tokenizer_config(p.parse_args(["--tokenizer", "gpt2"])))
    args = p.parse_args(["--spm-vocab-size", "300", "--spm-model-type", "bpe"])
    t = load_tokenizer(tokenizer_config(args), [str(sample_dir / "valid.target")])
    assert t.kind == "sentencepiece" and t.vocab_size == 300
    assert load_tokenizer(tokenizer_config(p.parse_args(["--tokenizer", "none"]))).encode(" a  b") == "a b"
