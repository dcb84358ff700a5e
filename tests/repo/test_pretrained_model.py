"""The one model the repository holds, models/debdesc-small-denoising (made by scripts/quality/pretrain.sh; the
quickstart fine-tunes it): a float16 Hugging Face folder of a few MB with its sentencepiece model and dict.txt,
that loads into seqtrain and rebuilds masked text, i.e. it is a denoising-pretrained BART."""

import json

import pytest
import torch
from safetensors.torch import load_file

from seqtrain.checkpoint.load import load_model
from seqtrain.data.dictionary import Dictionary
from seqtrain.data.tokenizer import SentencePieceTokenizer
from seqtrain.generation.sequence_generator import SequenceGenerator
from tests.utils import REPO

FOLDER = REPO / "models" / "debdesc-small-denoising"


def test_folder_is_a_small_float16_mbart_export_with_its_tokenizer():
    config = json.loads((FOLDER / "config.json").read_text())
    assert (config["model_type"], config["torch_dtype"], config["d_model"]) == ("mbart", "float16", 256)
    tensors = load_file(str(FOLDER / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.float16}
    assert (FOLDER / "model.safetensors").stat().st_size < 16_000_000
    assert "scripts/quality/pretrain.sh" in (FOLDER / "README.md").read_text()
    lm = load_model(str(FOLDER))
    # dict.txt (what fine-tuning data-bins reuse) is the model's dictionary without the <mask> the task appended
    d = Dictionary.load(str(FOLDER / "dict.txt"))
    assert lm.src_dict.symbols[: len(d)] == d.symbols and lm.src_dict.symbols[len(d) :] == ["<mask>"]
    assert lm.tokenizer == SentencePieceTokenizer.from_file(str(FOLDER / "spm.model"))


@pytest.mark.slow
def test_it_rebuilds_masked_descriptions():
    """First sentences of descriptions it never saw (the sample's test split, from the corpus' valid split), in
    the pretraining layout (<s> text </s>) with their 5th-7th pieces replaced by one <mask>: beam search gives back
    the text on both sides of the mask, as BART's pretraining teaches (13 of these 16 at the shipped model)."""
    lm = load_model(str(FOLDER))
    d, mask = lm.src_dict, lm.src_dict.index("<mask>")
    texts = (REPO / "data" / "debdesc-sample" / "test.source").read_text(encoding="utf-8").split("\n")[:16]
    gen = SequenceGenerator(lm.model, d, beam_size=4, max_len_b=40)
    rebuilt = 0
    for text in texts:
        ids = [d.index(p) for p in lm.tokenizer.encode(text.split(". ")[0]).split()[:20]]
        head, tail = [d.bos()] + ids[:4], ids[7:]
        src = torch.tensor([head + [mask] + tail + [d.eos()]])
        with torch.no_grad():
            out = gen.generate(src, torch.tensor([src.shape[1]]))[0][0]["tokens"].tolist()
        rebuilt += out[: len(head)] == head and out[-len(tail) - 1 :] == tail + [d.eos()]
    assert rebuilt >= 12, f"{rebuilt} of {len(texts)} rebuilt around the mask"


def test_a_transformers_round_trip_keeps_its_tokenizer(tmp_path):
    """The folder loaded and saved again by transformers (save_pretrained keeps tokenizer.json, drops spm.model,
    as peft's merge_and_unload + save does): seqtrain reads the tokenizer transformers wrote and summarizes as from
    the original folder (issue 40: it loaded with no tokenizer and wrote madeupwords, exit 0)."""
    transformers = pytest.importorskip("transformers")
    from seqtrain.generation.summarizer import Summarizer

    out = tmp_path / "saved"
    transformers.AutoTokenizer.from_pretrained(str(FOLDER)).save_pretrained(str(out))
    transformers.AutoModelForSeq2SeqLM.from_pretrained(str(FOLDER)).save_pretrained(str(out))
    assert (out / "tokenizer.json").exists() and not (out / "spm.model").exists()
    texts = (REPO / "data" / "debdesc-sample" / "test.source").read_text(encoding="utf-8").split("\n")[:3]
    original = Summarizer.from_pretrained(str(FOLDER)).summarize(texts, beam=2, max_len_b=12)
    again = Summarizer.from_pretrained(str(out)).summarize(texts, beam=2, max_len_b=12)
    assert again == original and not any("madeupword" in s for s in again), again
    spm = SentencePieceTokenizer.from_file(str(FOLDER / "spm.model"))
    lm = load_model(str(out))
    assert [lm.tokenizer.encode(t) for t in texts] == [spm.encode(t) for t in texts]


def test_its_card_and_tokenizer_config_suit_transformers_4_and_5():
    """The card names a task transformers 5 still has (it removed text2text-generation), and the tokenizer config
    names the model's inputs (transformers 4.x otherwise adds token_type_ids, which generate refuses)."""
    card = (FOLDER / "README.md").read_text()
    assert "pipeline_tag: summarization" in card and "text2text-generation" not in card
    config = json.loads((FOLDER / "tokenizer_config.json").read_text())
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
