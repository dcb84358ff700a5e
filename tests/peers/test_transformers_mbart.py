"""mBART against transformers' MBartForConditionalGeneration (random tiny weights, no downloads): an HF mBART
folder imports with its logits, seqtrain's mbart_large layout exports to a folder transformers loads with the same
logits, and a fairseq mbart_large checkpoint (state dict and args as fairseq writes them) imports.

mBART is BART with pre-norm layers, a final layer norm after each stack and embeddings scaled by sqrt(d_model);
sources are `tokens </s> [lang]` with no <s> first. Inputs are right-padded: HF's positions count from the row
start, fairseq's from the first real token, and both agree then.
"""

import argparse
import json

import pytest
import torch

from seqtrain.checkpoint.fairseq import export_fairseq, model_config
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.hf import export_hf
from seqtrain.checkpoint.load import LoadedModel, load_model
from seqtrain.data.dictionary import Dictionary
from seqtrain.models.bart import build_model
from seqtrain.registry import ARCHS
from tests.utils import FP32, completed

transformers = pytest.importorskip("transformers")

PAD, EOS = 1, 2
SIZES = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=48,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    max_source_positions=64,
    max_target_positions=64,
    dropout=0.0,
)


def perturb(model: torch.nn.Module) -> None:
    """Zero biases and unit layer norms would hide a misplaced one: move them all."""
    torch.manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)


def make_dict(words: int) -> Dictionary:
    d = Dictionary()
    for i in range(words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def batch(vocab: int):
    """Right-padded sources ending in </s> [lang] and decoder inputs starting with [lang] (rows of 3 lengths)."""
    g = torch.Generator().manual_seed(1)
    lang = vocab - 2
    src = torch.full((3, 9), PAD)
    prev = torch.full((3, 6), PAD)
    for i, (n, m) in enumerate(((9, 6), (5, 2), (3, 4))):
        src[i, : n - 2] = torch.randint(4, vocab - 3, (n - 2,), generator=g)
        src[i, n - 2 : n] = torch.tensor([EOS, lang])
        prev[i, 0] = lang
        prev[i, 1:m] = torch.randint(4, vocab - 3, (m - 1,), generator=g)
    return src, prev


def hf_logits(hf, src, prev):
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=src.ne(PAD).long(), decoder_input_ids=prev).logits


def ours_logits(model, src, prev):
    with torch.no_grad():
        full = model(src, None, prev)[0]
        enc = model.encoder(src, None)
        state: dict = {}
        steps = [
            model.decoder(prev[:, :t], enc, incremental_state=state)[0] for t in range(1, prev.size(1) + 1)
        ]
    return full, torch.cat(steps, dim=1)


def check_same(model, hf, vocab):
    src, prev = batch(vocab)
    real = prev.ne(PAD)
    ref = hf_logits(hf, src, prev)
    full, steps = ours_logits(model, src, prev)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(full[real], ref[real], **FP32)
    torch.testing.assert_close(steps[real], ref[real], **FP32)


def test_hf_mbart_folder_imports_with_its_logits(tmp_path):
    vocab = 48
    torch.manual_seed(0)
    cfg = transformers.MBartConfig(
        vocab_size=vocab,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        scale_embedding=True,
        dropout=0.0,
        decoder_start_token_id=vocab - 2,
        attn_implementation="eager",
    )
    hf = transformers.MBartForConditionalGeneration(cfg).eval()
    perturb(hf)
    hf.save_pretrained(tmp_path / "hf")
    lm = load_model(str(tmp_path / "hf"))
    a = lm.args
    # the arch is a label: the pre-norm preset of the nearest width (every size is also set explicitly)
    assert (a.arch, a.encoder_normalize_before, a.decoder_normalize_before) == ("mbart_base", True, True)
    assert a.no_scale_embedding is False and a.prepend_bos is False  # mBART sources: tokens </s> [lang]
    assert lm.model.encoder.layer_norm is not None and lm.model.encoder.embed_scale == pytest.approx(32**0.5)
    check_same(lm.model, hf, vocab)


def tiny_mbart(langs=None):
    """seqtrain's mbart_large layout at tiny sizes, for a 20-word dictionary (+ [lang] symbols and <mask>)."""
    d = make_dict(20)
    for lang in langs or ():
        d.add_symbol(f"[{lang}]")
    d.add_symbol("<mask>")
    args = argparse.Namespace(arch="mbart_large", **SIZES)
    if langs:
        args.langs, args.source_lang, args.target_lang = ",".join(langs), langs[0], langs[1]
    torch.manual_seed(4)
    model = build_model(model_config(completed(args)), d, d).eval()
    perturb(model)
    return model, args, d


def test_mbart_large_preset_is_fairseqs_layout():
    model, args, _ = tiny_mbart()
    assert (args.encoder_normalize_before, args.decoder_normalize_before, args.no_scale_embedding) == (
        True,
        True,
        False,
    )
    assert args.layernorm_embedding and args.share_all_embeddings
    keys = set(model.state_dict())
    assert {
        "encoder.layer_norm.weight",
        "decoder.layer_norm.bias",
        "encoder.layernorm_embedding.weight",
    } <= keys
    full = argparse.Namespace()
    ARCHS.get("mbart_large")(full)  # the preset alone (building 400M parameters would only cost time)
    assert (
        full.encoder_embed_dim,
        full.encoder_layers,
        full.decoder_layers,
        full.encoder_attention_heads,
    ) == (
        1024,
        12,
        12,
        16,
    )


def test_export_loads_in_transformers_with_the_same_logits(tmp_path):
    model, args, d = tiny_mbart(["en_XX", "ro_RO"])
    export_hf(LoadedModel(model, args, d, d), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "mbart" and config["scale_embedding"] is True
    ro = d.index("[ro_RO]")
    assert config["decoder_start_token_id"] == ro  # decoding begins with the target language token
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["decoder_start_token_id"] == ro and gen["forced_bos_token_id"] is None
    hf = transformers.MBartForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
    assert isinstance(hf.config, transformers.MBartConfig)
    check_same(model, hf, len(d))


def test_fairseq_mbart_checkpoint_imports(tmp_path):
    """The keys fairseq writes for mbart_large (encoder/decoder.version, the final layer norms, a tied
    output_projection) and its args (translation_from_pretrained_bart, --langs) load to the same logits; the
    fairseq export of it reads back the same too."""
    model, args, d = tiny_mbart(["en_XX", "ro_RO"])
    state = dict(model.state_dict())
    state["encoder.version"] = torch.tensor([3.0])
    state["decoder.version"] = torch.tensor([3.0])
    ns = argparse.Namespace(**vars(args))
    ns.task, ns.prepend_bos, ns.encoder_learned_pos, ns.decoder_learned_pos = (
        "translation_from_pretrained_bart",
        False,
        True,
        True,
    )
    folder = tmp_path / "mbart.cc25"
    folder.mkdir()
    save_checkpoint_file(
        {"args": ns, "model": state, "optimizer_history": [], "extra_state": {}}, str(folder / "model.pt")
    )
    # fairseq's dict.txt holds the words only: the task adds [lang] and <mask> when it loads (see --langs)
    make_dict(20).save(str(folder / "dict.txt"))
    lm = load_model(str(folder / "model.pt"), dict_path=str(folder / "dict.txt"))
    assert lm.args.arch == "mbart_large" and lm.args.langs == "en_XX,ro_RO"
    src, prev = batch(len(d))
    want, _ = ours_logits(model, src, prev)
    got, steps = ours_logits(lm.model, src, prev)
    real = prev.ne(PAD)
    assert len(lm.tgt_dict) == len(d)  # the 3 rows beyond dict.txt kept for [en_XX] [ro_RO] <mask>
    torch.testing.assert_close(got[real], want[real], atol=0, rtol=0)
    torch.testing.assert_close(steps[real], want[real], **FP32)
    export_fairseq(lm, str(tmp_path / "out" / "model.pt"))
    written = load_checkpoint_file(str(tmp_path / "out" / "model.pt"))
    assert written["args"].arch == "mbart_large" and written["args"].langs == "en_XX,ro_RO"
    assert "encoder.layer_norm.weight" in written["model"]


def test_generation_from_hf_mbart_starts_at_its_decoder_start_token_as_transformers(tmp_path):
    """An HF mBART folder whose decoder_start_token_id is a language code: seqtrain's beam search starts there
    (and ends at </s>, as transformers does) and gives transformers' generate() tokens, same beam and length."""
    from seqtrain.generation import runner
    from seqtrain.generation.search import GenerationConfig
    from seqtrain.generation.sequence_generator import build_generator

    vocab = 48
    lang = vocab - 2
    torch.manual_seed(0)
    cfg = transformers.MBartConfig(
        vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
        scale_embedding=True, dropout=0.0, decoder_start_token_id=lang, forced_eos_token_id=EOS,
    )  # fmt: skip
    hf = transformers.MBartForConditionalGeneration(cfg).eval()
    perturb(hf)
    hf.save_pretrained(tmp_path / "hf")
    make_dict(vocab - 4).save(str(tmp_path / "dict.txt"))
    loaded = runner.load_for_generation(str(tmp_path / "hf"), dict_path=str(tmp_path / "dict.txt"))
    assert (loaded.start, loaded.end, loaded.force_bos) == (lang, None, None)
    config = GenerationConfig(beam=3, max_len_b=8, min_len=1)
    generator = build_generator(loaded.model, loaded.lm.tgt_dict, config, bos=loaded.start, eos=loaded.end)
    src, _ = batch(vocab)
    for row in src:
        row = row[row.ne(PAD)].unsqueeze(0)
        ours = generator.generate(row)[0][0]["tokens"].tolist()
        with torch.no_grad():
            theirs = hf.generate(
                input_ids=row, num_beams=3, max_length=8 + 2, min_length=2, early_stopping=True,
                length_penalty=1.0, do_sample=False, suppress_tokens=[PAD], no_repeat_ngram_size=0,
            )[0].tolist()  # fmt: skip
        assert theirs[0] == lang  # transformers starts from the config's decoder_start_token_id
        theirs = [t for t in theirs[1:] if t != PAD]
        assert ours == theirs and ours[-1] == EOS
