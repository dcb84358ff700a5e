"""The tokenizer files of a Hugging Face export (seqtrain.checkpoint.hf_files.export_tokenizer), read with the
`tokenizers` library alone: the ids of the sample's texts equal seqtrain's (tokenizer + dictionary) for GPT-2 BPE
and sentencepiece unigram and BPE models; tokens the dictionary lacks are counted."""

import collections

import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer  # noqa: E402

from seqtrain.checkpoint.hf_files import export_tokenizer, read_spm_tokenizer, tokenizer_prepends_bos  # noqa: E402
from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.data.tokenizer import GPT2BPETokenizer, SentencePieceTokenizer  # noqa: E402
from tests.utils import SAMPLE  # noqa: E402


def lines(split, n):
    return (SAMPLE / f"{split}.source").read_text(encoding="utf-8").split("\n")[:n]


TRAIN = lines("train", 1500)
TEXTS = lines("valid", 150) + [
    "  leading and   inner  spaces ",
    "café naïve 日本語",
    "x\ty\u00a0z",
]


@pytest.fixture(scope="module")
def tokenizers_(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    tmp = tmp_path_factory.mktemp("bpe")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TRAIN, vocab_size=800, min_frequency=2, show_progress=False)
    bpe.save_model(str(tmp))
    return {
        "gpt2": GPT2BPETokenizer.from_files(str(tmp / "vocab.json"), str(tmp / "merges.txt")),
        "unigram": SentencePieceTokenizer.train_iter(TRAIN, vocab_size=500, num_threads=1),
        "bpe": SentencePieceTokenizer.train_iter(TRAIN, vocab_size=500, model_type="bpe", num_threads=1),
    }


def every_symbol(tok):
    if tok.kind == "gpt2":
        return [str(i) for i in range(tok.vocab_size)]
    return [
        tok.sp.IdToPiece(i)
        for i in range(tok.vocab_size)
        if not tok.sp.IsControl(i) and not tok.sp.IsUnknown(i)
    ]


def dictionary(tok, full=True):
    counts = collections.Counter(s for line in TRAIN for s in tok.encode(line).split())
    d = Dictionary()
    for sym, n in counts.most_common():
        d.add_symbol(sym, n)
    if full:
        for sym in every_symbol(tok):
            d.add_symbol(sym, 1)
    return d


def seqtrain_ids(tok, d, text, bos):
    return ([0] if bos else []) + d.encode_line(tok.encode(text), add_if_not_exist=False).tolist()


@pytest.mark.parametrize("kind", ["gpt2", "unigram", "bpe"])
@pytest.mark.parametrize("bos", [False, True])
def test_ids_equal_seqtrains(tokenizers_, kind, bos, tmp_path):
    tok = tokenizers_[kind]
    d = dictionary(tok)
    done = export_tokenizer(str(tmp_path), tok.spec(), d, prepend_bos=bos, max_positions=1024)
    assert done["missing"] == 0 and done["kind"] == tok.kind
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    got = [e.ids for e in hf.encode_batch(TEXTS)]
    want = [seqtrain_ids(tok, d, t, bos) for t in TEXTS]
    assert got == want
    assert sum(len(w) for w in want) > 3000 and sum(3 in w for w in want) <= 3  # real texts, few <unk>
    assert tokenizer_prepends_bos(str(tmp_path)) is bos
    # decoding the ids (specials skipped) gives seqtrain's detokenized text (<unk>: spm writes " ⁇ ", HF skips it)
    for ids in [ids for ids in got if 3 not in ids][:50]:
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(d.string(ids[1:] if bos else ids))
    # the one known difference: a special token written in the text is that token for transformers' tokenizer,
    # plain text for seqtrain's (docs/finetune.md)
    assert hf.encode("<unk> x").ids[int(bos)] == 3 != seqtrain_ids(tok, d, "<unk> x", bos)[int(bos)]
    if kind != "gpt2":  # seqtrain reads the folder back: the dictionary's symbols and the sentencepiece model
        names, spec = read_spm_tokenizer(str(tmp_path))
        assert names == d.symbols and spec == tok.spec()


def test_tokens_missing_from_the_dictionary_are_counted(tokenizers_, tmp_path):
    tok = tokenizers_["gpt2"]
    d = dictionary(tok, full=False)  # only what the training text uses
    done = export_tokenizer(str(tmp_path), tok.spec(), d, prepend_bos=False, max_positions=1024)
    used = {s for line in TRAIN for s in tok.encode(line).split()}
    assert done["missing"] == tok.vocab_size - len(used) > 0
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    # texts that only use the dictionary's tokens are still tokenized as seqtrain does
    inside = [t for t in TRAIN[:200] if t]
    assert [hf.encode(t).ids for t in inside] == [seqtrain_ids(tok, d, t, False) for t in inside]


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_tokenizer_json_alone_reads_as_the_sentencepiece_model(tokenizers_, kind, tmp_path):
    """A sentencepiece export whose spm.model is gone (transformers' save_pretrained keeps only tokenizer.json):
    read_tokenizer_json gives the same pieces, the same ids and the same decoded text as the sentencepiece model
    and the dictionary (issue 40: the folder used to load with no tokenizer and generate madeupwords)."""
    from seqtrain.checkpoint.hf_files import read_tokenizer_json
    from seqtrain.data.tokenizer import build_tokenizer

    tok = tokenizers_[kind]
    d = dictionary(tok)
    export_tokenizer(str(tmp_path), tok.spec(), d, prepend_bos=False, max_positions=1024)
    (tmp_path / "spm.model").unlink()
    names, spec = read_tokenizer_json(str(tmp_path))
    assert spec["kind"] == "tokenizer_json" and names == d.symbols
    read = build_tokenizer(spec)
    assert [seqtrain_ids(read, d, t, False) for t in TEXTS] == [seqtrain_ids(tok, d, t, False) for t in TEXTS]

    # the same pieces; a character no piece holds is <unk> to the dictionary both ways (sentencepiece keeps the
    # character, tokenizers' BPE writes <unk>)
    def pieces(encoded):
        return [[p if p in d.indices else "<unk>" for p in e.split()] for e in encoded]

    want = pieces(tok.encode_batch(TEXTS))
    assert pieces(read.encode(t) for t in TEXTS) == want and pieces(read.encode_batch(TEXTS)) == want
    assert [read.decode(tok.encode(t)) for t in TEXTS] == [tok.decode(tok.encode(t)) for t in TEXTS]


def test_a_gpt2_tokenizer_json_is_left_to_the_gpt2_reader(tokenizers_, tmp_path):
    from seqtrain.checkpoint.hf_files import read_tokenizer_json

    tok = tokenizers_["gpt2"]
    export_tokenizer(str(tmp_path), tok.spec(), dictionary(tok), prepend_bos=True, max_positions=1024)
    assert read_tokenizer_json(str(tmp_path)) == (None, None)


def test_an_unreadable_tokenizer_json_is_one_line_naming_it(tmp_path):
    from seqtrain.checkpoint.hf_files import read_tokenizer_json
    from seqtrain.errors import SeqtrainError

    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nope"}}')
    with pytest.raises(SeqtrainError, match=r"tokenizer\.json: not a tokenizer the tokenizers library reads"):
        read_tokenizer_json(str(tmp_path))


def test_the_tokenizer_config_names_the_models_inputs(tokenizers_, tmp_path):
    """tokenizer_config.json says the model takes input_ids and attention_mask: transformers 4.x's
    PreTrainedTokenizerFast otherwise returns token_type_ids too, and model.generate(**tokenizer(texts)) fails on
    them (issue 40)."""
    import json

    tok = tokenizers_["unigram"]
    export_tokenizer(str(tmp_path), tok.spec(), dictionary(tok), prepend_bos=False, max_positions=1024)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.model_input_names == ["input_ids", "attention_mask"]
    assert set(hf(TEXTS[:2], return_tensors="pt", padding=True)) == {"input_ids", "attention_mask"}
