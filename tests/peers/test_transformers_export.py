"""`seqtrain-convert --to hf` exports that transformers loads whole: AutoTokenizer gives seqtrain's token ids and
AutoModelForSeq2SeqLM.generate() with the folder's own generation_config.json the summaries seqtrain-generate
writes, for a GPT-2 BPE and a sentencepiece model made here; the export reads back into seqtrain with its
tokenizer files."""

import argparse
import collections
import contextlib
import io
import json
import os
import re

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import save_checkpoint_file
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.tokenizer import GPT2BPETokenizer, SentencePieceTokenizer
from seqtrain.models.bart import build_model
from tests.unit.generation.reference_beam_search import fairseq_forced_eos
from tests.utils import SAMPLE, completed

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")

TEXTS = [
    "The council approved the new budget on Monday after a long debate.",
    "Police said two men were arrested near the station.",
    "Scientists found water on the surface of the distant planet!",
    "Prices rose sharply, and shoppers complained.",
    "A café in the old town reopened; naïve visitors queued.",
    "multiple   spaces  and\ttabs here",
]
GEN = ["--beam", "4", "--lenpen", "1.5", "--max-len-b", "24", "--min-len", "3", "--no-repeat-ngram-size", "2"]


def lines(n=1500):
    return (SAMPLE / "train.target").read_text(encoding="utf-8").split("\n")[:n]


def gpt2_tokenizer(tmp):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines(), vocab_size=600, min_frequency=2, show_progress=False)
    bpe.save_model(str(tmp))
    return GPT2BPETokenizer.from_files(str(tmp / "vocab.json"), str(tmp / "merges.txt"))


def spm_tokenizer():
    return SentencePieceTokenizer.train_iter(lines(), vocab_size=400, num_threads=1)


def dictionary(tok, every):
    """Symbols counted on the training text, most frequent first, as seqtrain-preprocess counts them; then the
    tokenizer's other symbols (`every`), so the dictionary holds them all, in an order unlike the tokenizer's."""
    counts = collections.Counter(s for line in lines() for s in tok.encode(line).split())
    d = Dictionary()
    for sym, n in counts.most_common():
        d.add_symbol(sym, n)
    for sym in every:
        d.add_symbol(sym, 1)
    return d


def tiny_checkpoint(path, d, tok, prepend_bos=False, seed=0):
    """A random bart_tiny whose summaries depend on the text: large weights, and a </s> row that wins after a few
    tokens now and then (so the search ends before its max length)."""
    torch.manual_seed(seed)
    args = argparse.Namespace(
        arch="bart_tiny", dropout=0.0, prepend_bos=prepend_bos, max_source_positions=128
    )
    args.max_target_positions = 128
    model = build_model(model_config(completed(args)), d, d).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
        # the last layer's output leans towards </s>: its logit is the highest now and then
        e = model.encoder.embed_tokens.weight[d.eos()]
        model.decoder.layers[-1].final_layer_norm.bias.copy_(3.0 * e / e.norm())
    state = make_checkpoint_state(args, dict(model.state_dict()), d, d, tok.spec())
    save_checkpoint_file(state, str(path))


def seqtrain_summaries(path, tmp, *flags, text=None):
    from seqtrain_cli.generate import generate_main

    (tmp / "in.txt").write_text("\n".join([text] if text else TEXTS) + "\n", encoding="utf-8")
    out = io.StringIO()
    generate_main(["--path", str(path), "--input", str(tmp / "in.txt"), "--cpu", *flags], out=out)
    return out.getvalue().split("\n")[:-1]


def seqtrain_ids(path, texts):
    from seqtrain.generation import runner

    loaded = runner.load_for_generation(str(path))
    bos = [loaded.lm.src_dict.bos()] if getattr(loaded.lm.args, "prepend_bos", False) else []
    return [bos + t.tolist() for t in runner.encode(loaded, texts)]


def export(ckpt, folder, *flags):
    from seqtrain_cli.convert import main as convert

    convert([str(ckpt), str(folder), "--to", "hf", *flags])


class ForcedBosKeepsItsScore(transformers.LogitsProcessor):
    """seqtrain's forced <s>: it keeps its log-probability (transformers' forced_bos_token_id gives it 0)."""

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] == 1:
            kept = scores[:, 0].clone()
            scores = torch.full_like(scores, -float("inf"))
            scores[:, 0] = kept
        return scores


def hf_summaries(folder, **generate_kwargs):
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    got = []
    for text in TEXTS:  # one at a time: seqtrain-generate's batches are padded differently
        batch = tok([text], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**batch, **generate_kwargs)
        got.append(tok.decode(out[0], skip_special_tokens=True))
    return tok, got


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    gpt2 = gpt2_tokenizer(tmp)
    spm = spm_tokenizer()
    made = {}
    for name, tok, every, prepend in (
        ("gpt2", gpt2, [str(i) for i in range(gpt2.vocab_size)], False),
        ("gpt2-bos", gpt2, [str(i) for i in range(gpt2.vocab_size)], True),
        ("spm", spm, [spm.sp.IdToPiece(i) for i in range(3, spm.vocab_size)], False),
    ):
        d = dictionary(tok, every)
        if name.startswith("gpt2"):
            d.add_symbol("<mask>")  # as BART's dictionary ends
        ckpt = tmp / f"{name}.pt"
        tiny_checkpoint(ckpt, d, tok, prepend_bos=prepend)
        export(ckpt, tmp / f"{name}-hf", *GEN)
        made[name] = (ckpt, tmp / f"{name}-hf", d, tok)
    return tmp, made


@pytest.mark.parametrize("kind", ["gpt2", "spm", "gpt2-bos"])
def test_transformers_tokenizes_and_generates_as_seqtrain(exports, kind):
    tmp, made = exports
    ckpt, folder, d, tok = made[kind]
    files = set(os.listdir(folder))
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "README.md",
        "tokenizer.json",
    } <= files
    assert {"tokenizer_config.json", "special_tokens_map.json"} <= files
    gpt2, bos = kind.startswith("gpt2"), kind == "gpt2-bos"
    assert ({"vocab.json", "merges.txt"} <= files) == gpt2 and ("spm.model" in files) == (not gpt2)
    gen = json.loads((folder / "generation_config.json").read_text())
    assert (gen["num_beams"], gen["length_penalty"], gen["max_length"], gen["min_length"]) == (4, 1.5, 26, 4)
    assert (gen["no_repeat_ngram_size"], gen["decoder_start_token_id"], gen["forced_eos_token_id"]) == (
        2,
        2,
        2,
    )
    assert gen["forced_bos_token_id"] == (0 if bos else None) and gen["suppress_tokens"] == [1]
    hf_tok, hf = hf_summaries(folder)
    # the model card names the settings, and its snippet runs as written next to the folder
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "num_beams 4, length_penalty 1.5, max_length 26, min_length 4, no_repeat_ngram_size 2" in card
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert f'from_pretrained("{folder.name}")' in code
    cwd = os.getcwd()
    os.chdir(folder.parent)
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    summary = seqtrain_summaries(ckpt, tmp, *GEN, text="A text to summarize.")
    assert printed.getvalue().startswith("['") and (bos or printed.getvalue() == repr(summary) + "\n")
    # token ids: the dictionary's indices, <s> first only for the --prepend-bos model, </s> last
    want = seqtrain_ids(ckpt, TEXTS)
    assert [hf_tok(t)["input_ids"] for t in TEXTS] == want
    assert all(ids[-1] == 2 and (ids[0] == 0) == bos for ids in want)
    if gpt2:  # vocab.json maps each BPE token to its dictionary index, as the released BART folders
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        enc = json.loads(tok.encoder_json)
        assert all(vocab[t] == d.index(str(i)) for t, i in enc.items())
        assert vocab["<mask>"] == d.index("<mask>") == len(d) - 1
        assert sum(vocab[t] != i for t, i in enc.items()) > 100  # the dictionary's order is not GPT-2's
    # generate() with the folder's defaults = seqtrain-generate with the same settings
    mine = seqtrain_summaries(ckpt, tmp, *GEN)
    if bos:
        # transformers' forced <s> and </s> score 0, seqtrain's keep their log-probabilities, which reorders
        # hypotheses of different lengths (docs/generate.md): with seqtrain's rule, the summaries are the same
        assert hf != mine
        keep = [ForcedBosKeepsItsScore(), fairseq_forced_eos(gen["max_length"], 2)]
        hf = hf_summaries(folder, forced_bos_token_id=None, forced_eos_token_id=None, logits_processor=keep)[
            1
        ]
    assert hf == mine
    assert len(set(mine)) == len(TEXTS) and all(len(s.split()) >= 1 for s in mine)
    lengths = [len(hf_tok(s, add_special_tokens=False)["input_ids"]) for s in mine]
    assert min(lengths) < 24  # some summaries end before the max length (a real </s>, not the forced one)


@pytest.mark.parametrize("kind", ["gpt2-bos", "spm"])
def test_the_export_reads_back_into_seqtrain_with_its_tokenizer(exports, kind, tmp_path):
    from seqtrain.checkpoint.load import load_model
    from seqtrain_cli.convert import main as convert

    tmp, made = exports
    ckpt, folder, d, tok = made[kind]
    back = tmp_path / "back.pt"
    convert([str(folder), str(back), "--to", "seqtrain"])
    lm = load_model(str(back))
    assert lm.tokenizer is not None and lm.tokenizer.kind == (
        "gpt2" if kind == "gpt2-bos" else "sentencepiece"
    )
    # <s> first as the tokenizer.json's post-processor says (a Hugging Face folder without one: <s> first)
    assert lm.args.prepend_bos == (kind == "gpt2-bos")
    # the same ids for the texts (the dictionary's symbols are renamed for gpt2: HF ids as decimal strings)
    assert seqtrain_ids(back, TEXTS) == seqtrain_ids(ckpt, TEXTS) == seqtrain_ids(folder, TEXTS)
    # --path on the folder: its generation_config.json gives the defaults, and the summaries are the original's
    mine = seqtrain_summaries(ckpt, tmp, *GEN)
    assert seqtrain_summaries(folder, tmp_path) == mine
    assert seqtrain_summaries(back, tmp_path, *GEN) == mine
