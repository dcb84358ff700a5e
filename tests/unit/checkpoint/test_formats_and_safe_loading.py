"""seqtrain.checkpoint.files / formats / models.resize / hub: safe loading, atomic save, fairseq and Hugging Face
import, vocab resize."""

import argparse
import json
import logging
import os
import pickle

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.checkpoint.hf import hf_config_to_args
from seqtrain.checkpoint.load import load_model
from seqtrain.checkpoint.native import export_seqtrain, make_checkpoint_state
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain.models.resize import resize_embeddings
from tests.utils import FP32, completed


def make_dict(n_words: int) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def tiny_model(d: Dictionary, seed: int = 0):
    torch.manual_seed(seed)
    args = argparse.Namespace(arch="bart_tiny", encoder_layers=1, decoder_layers=1, dropout=0.0)
    return build_model(model_config(completed(args)), d, d).eval(), args


def batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (2, 7), generator=g)
    src[1, :3] = 1  # left-padded second row, as the translation task pads sources
    src[:, -1] = 2
    prev = torch.randint(4, vocab, (2, 5), generator=g)
    prev[:, 0] = 2
    return src, src.ne(1).sum(1), prev


def logits(model, src, lengths, prev):
    with torch.no_grad():
        return model(src, lengths, prev)[0]


# ----------------------------------------------------------------------------------------------- file level
def test_save_load_roundtrip_and_failed_write_keeps_old_file(tmp_path):
    path = str(tmp_path / "ck.pt")
    save_checkpoint_file({"a": torch.arange(3), "args": argparse.Namespace(x=1)}, path)
    before = open(path, "rb").read()
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        save_checkpoint_file({"bad": lambda x: x}, path)  # lambdas do not pickle: the write fails midway
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temp file left behind
    obj = load_checkpoint_file(path)
    assert obj["a"].tolist() == [0, 1, 2] and obj["args"].x == 1


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_code_running_pickle_refused_unless_unsafe(tmp_path):
    marker = str(tmp_path / "marker")
    path = str(tmp_path / "evil.pt")
    torch.save({"model": {}, "payload": _Evil(marker)}, path)
    with pytest.raises(SeqtrainError) as e:
        load_checkpoint_file(path)
    msg = str(e.value)
    assert path in msg and "arbitrary unpickling" in msg and "--unsafe-load" in msg and "mkdir" in msg
    assert "\n" not in msg
    assert not os.path.exists(marker)
    with pytest.raises(SeqtrainError):
        read_checkpoint(path)
    assert not os.path.exists(marker)
    load_checkpoint_file(path, unsafe=True)
    assert os.path.isdir(marker)


def test_damaged_files_give_one_clear_error_each(tmp_path):
    good = str(tmp_path / "good.pt")
    d = make_dict(20)
    model, args = tiny_model(d)
    save_checkpoint_file(make_checkpoint_state(args, model.state_dict(), d, d), good)
    data = open(good, "rb").read()
    cases = {
        "missing.pt": (None, "not found"),
        "truncated.pt": (data[: len(data) // 2], "truncated or corrupted"),
        "random.bin": (bytes(range(256)) * 8, "not a PyTorch checkpoint"),
        "notes.txt": (b"just some text\nsecond line\n", "not a PyTorch checkpoint"),
        "empty.pt": (b"", "empty"),
    }
    for name, (content, expected) in cases.items():
        path = str(tmp_path / name)
        if content is not None:
            open(path, "wb").write(content)
        with pytest.raises(SeqtrainError) as e:
            load_checkpoint_file(path)
        assert path in str(e.value) and expected in str(e.value) and "\n" not in str(e.value), (name, e.value)


# ----------------------------------------------------------------------------------------------- formats
def test_seqtrain_checkpoint_roundtrip_and_overrides(tmp_path):
    d = make_dict(20)
    model, args = tiny_model(d)
    path = str(tmp_path / "st.pt")
    save_checkpoint_file(
        make_checkpoint_state(args, model.state_dict(), d, d, training=TrainState(epoch=3)), path
    )
    raw = torch.load(path, weights_only=True)  # plain data only: loads with no allowlist at all
    assert raw["src_dict"][4] == ["w0", 100] and raw["extra_state"]["epoch"] == 3
    lm = load_model(path, arch_overrides={"dropout": 0.3})
    assert lm.format == "seqtrain" and lm.src_dict == d and lm.args.dropout == 0.3
    assert lm.model.encoder.dropout == 0.3 and not lm.model.training
    src, lengths, prev = batch(len(d))
    torch.testing.assert_close(
        logits(lm.model, src, lengths, prev), logits(model, src, lengths, prev), rtol=0, atol=0
    )
    model_, args_, src_dict, tgt_dict, tok = lm  # the tuple form of docs/design.md
    assert model_ is lm.model and tok is None


def test_loading_draws_no_initial_weights_and_keeps_every_loaded_one_and_the_ties(tmp_path):
    """load_model builds the model without drawing random initial weights (the strict load sets every one):
    the global random stream is left where it was, the state equals the file's bit for bit, the output
    projection stays tied to the embeddings, and torch.nn.init works as before afterwards."""
    d = make_dict(20)
    model, args = tiny_model(d)
    path = str(tmp_path / "st.pt")
    save_checkpoint_file(make_checkpoint_state(args, model.state_dict(), d, d), path)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    lm = load_model(path)
    assert torch.equal(torch.get_rng_state(), before)  # building the model drew nothing
    want = model.state_dict()
    got = lm.model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    dec = lm.model.decoder
    assert dec.output_projection.weight is dec.embed_tokens.weight
    # the init functions are torch's again: a fresh layer is initialized as usual
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 8).weight.detach().clone()
    torch.manual_seed(0)
    b = torch.empty(8, 8)
    torch.nn.init.kaiming_uniform_(b, a=5**0.5)
    assert torch.equal(a, b) and a.abs().sum() > 0


def _backing_file(t: torch.Tensor) -> str | None:
    """The file whose mapping holds `t`'s memory (Linux /proc/self/maps), "" for anonymous memory."""
    addr = t.untyped_storage().data_ptr()
    with open("/proc/self/maps", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5] if len(parts) > 5 else ""
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_checkpoints_are_mapped_not_read_when_loading_a_model(tmp_path):
    """read_checkpoint maps a zip-format file: the optimizer state a model load never touches stays in the
    file (backed by it, not read into memory), the model still equals the saved one, and a legacy-format file
    (which torch cannot map) loads as before."""
    d = make_dict(20)
    model, args = tiny_model(d)
    state = make_checkpoint_state(args, model.state_dict(), d, d)
    state["optimizer"] = {"state": {0: {"exp_avg": torch.randn(64, 1024)}}, "param_groups": []}
    path = str(tmp_path / "st.pt")
    save_checkpoint_file(state, path)
    real = os.path.realpath(path)
    mapped = read_checkpoint(path).state["optimizer"]["state"][0]["exp_avg"]
    assert _backing_file(mapped) == real
    read = load_checkpoint_file(path)["optimizer"]["state"][0]["exp_avg"]  # a plain read: in memory
    assert _backing_file(read) != real and torch.equal(read, mapped)
    lm = load_model(path)
    got = lm.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    assert all(_backing_file(v) != real for v in got.values())  # the model owns its weights

    legacy = str(tmp_path / "legacy.pt")
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    lm = load_model(legacy)
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in model.state_dict().items())


def test_a_file_that_cannot_be_mapped_is_read_instead(tmp_path, monkeypatch):
    """Where mapping fails (a file system without mmap), the checkpoint is read as without it; a damaged file
    still gets its one clear line."""
    d = make_dict(20)
    model, args = tiny_model(d)
    path = str(tmp_path / "st.pt")
    save_checkpoint_file(make_checkpoint_state(args, model.state_dict(), d, d), path)
    real_load = torch.load

    def no_mmap(*a, **kw):
        if kw.get("mmap"):
            raise OSError("mmap: operation not supported")
        return real_load(*a, **kw)

    monkeypatch.setattr(torch, "load", no_mmap)
    lm = load_model(path)
    assert all(torch.equal(lm.model.state_dict()[k], v) for k, v in model.state_dict().items())
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(SeqtrainError, match="truncated or corrupted"):
        load_model(path)


def fairseq_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """What fairseq stores: all of its flags, not only the model's."""
    full = argparse.Namespace(**vars(args))
    build_model(
        model_config(completed(full)), make_dict(20), make_dict(20)
    )  # fills the preset fields, as fairseq's arch functions do
    full.lr, full.optimizer, full.task, full.max_tokens = [0.001], "adam", "translation", 2048
    full.encoder_normalize_before = full.decoder_normalize_before = False
    full.no_scale_embedding, full.layernorm_embedding, full.share_decoder_input_output_embed = (
        True,
        True,
        True,
    )
    return full


@pytest.mark.parametrize("style", ["args", "cfg_namespace", "cfg_dict"])
def test_fairseq_layouts_load(tmp_path, style, caplog):
    d = make_dict(20)
    model, args = tiny_model(d)
    ns = fairseq_namespace(args)
    state = dict(model.state_dict())
    state["encoder.version"] = torch.tensor([3.0])
    state["decoder.version"] = torch.tensor([3.0])
    state["classification_heads.mnli.dense.weight"] = torch.zeros(4, 64)
    if style == "args":
        ck = {"args": ns, "model": state, "optimizer_history": [], "extra_state": {}}
        del state["decoder.output_projection.weight"]  # older fairseq files: tied, so not stored
    elif style == "cfg_namespace":
        ck = {"args": None, "cfg": {"model": ns, "task": {"_name": "translation"}}, "model": state}
    else:
        ck = {"args": None, "cfg": {"model": {"_name": "bart_tiny", **vars(ns)}}, "model": state}
        del ck["cfg"]["model"]["arch"]
    folder = tmp_path / style
    folder.mkdir()
    if style == "args":  # released bart.*/model.pt files predate torch's zip format
        torch.save(ck, str(folder / "model.pt"), _use_new_zipfile_serialization=False)
    else:
        save_checkpoint_file(ck, str(folder / "model.pt"))
    d.save(str(folder / "dict.txt"))  # found next to the checkpoint
    with caplog.at_level(logging.INFO):
        lm = load_model(str(folder / "model.pt"))
    assert lm.format == "fairseq" and lm.args.arch == "bart_tiny" and lm.args.encoder_layers == 1
    assert not hasattr(lm.args, "lr")  # only model fields are kept
    assert any("encoder.version" in r.getMessage() for r in caplog.records)
    src, lengths, prev = batch(len(d))
    torch.testing.assert_close(
        logits(lm.model, src, lengths, prev), logits(model, src, lengths, prev), rtol=0, atol=0
    )


def test_fairseq_without_dictionary_and_unsupported_variant(tmp_path):
    d = make_dict(20)
    model, args = tiny_model(d)
    ns = fairseq_namespace(args)
    path = str(tmp_path / "model.pt")
    save_checkpoint_file({"args": ns, "model": model.state_dict()}, path)
    with pytest.raises(SeqtrainError, match="--dict"):
        load_model(path)
    ns.cross_self_attention = True
    save_checkpoint_file({"args": ns, "model": model.state_dict()}, path)
    with pytest.raises(SeqtrainError, match="cross_self_attention=True"):
        read_checkpoint(path, require_dict=False)
    with pytest.raises(SeqtrainError, match="is a fairseq checkpoint, not seqtrain"):
        read_checkpoint(path, fmt="seqtrain", require_dict=False)


def test_weights_not_fitting_the_arch_list_names_and_shapes(tmp_path):
    d = make_dict(20)
    model, args = tiny_model(d)
    state = dict(model.state_dict())
    # (a model dimension in the args that disagrees with the weights is refused earlier, before building)
    state["encoder.layers.0.fc2.weight"] = torch.zeros(64, 7)
    del state["decoder.layers.0.fc2.bias"]
    path = str(tmp_path / "st.pt")
    save_checkpoint_file(make_checkpoint_state(args, state, d, d), path)
    with pytest.raises(SeqtrainError) as e:
        load_model(path)
    msg = str(e.value)
    assert "encoder.layers.0.fc2.weight (64, 7) vs model (64, 128)" in msg
    assert "missing: decoder.layers.0.fc2.bias" in msg and path in msg


# ----------------------------------------------------------------------------------------------- vocab resize
def test_resize_embeddings_truncate_and_extend(caplog):
    emb = torch.randn(20, 8)
    state = {
        "encoder.embed_tokens.weight": emb,
        "decoder.embed_tokens.weight": emb,
        "decoder.output_projection.weight": emb,
        "other": torch.ones(2),
    }
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        small = resize_embeddings(state, 16, 16, where="x.pt")
    assert len(caplog.records) == 1 and "truncated 4 rows" in caplog.records[0].getMessage()
    for k in (
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "decoder.output_projection.weight",
    ):
        assert small[k].shape == (16, 8) and torch.equal(small[k], emb[:16])
    assert small["encoder.embed_tokens.weight"] is small["decoder.output_projection.weight"]  # still tied
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        big = resize_embeddings(state, 25, 25)
    assert len(caplog.records) == 1 and "added 5 rows (mean init)" in caplog.records[0].getMessage()
    w = big["decoder.output_projection.weight"]
    assert w.shape == (25, 8) and torch.equal(w[:20], emb)
    mean = torch.cat([emb[:1], emb[2:]]).mean(0)  # padding row 1 excluded
    torch.testing.assert_close(w[20:], mean.expand(5, 8))
    normal = resize_embeddings(state, 25, 25, init="normal")["encoder.embed_tokens.weight"]
    assert torch.equal(normal[:20], emb) and 0.005 < normal[20:].std().item() < 0.05
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        same = resize_embeddings(state, 20, 20)
    assert not caplog.records and same["encoder.embed_tokens.weight"] is emb


def test_checkpoint_with_more_rows_than_dictionary_loads_truncated(tmp_path):
    # padded rows past the dict, as many as fairseq's --padding-factor 8 can add (7; more: see below)
    big_d, small_d = make_dict(27), make_dict(20)
    model, args = tiny_model(big_d)
    path = str(tmp_path / "model.pt")
    save_checkpoint_file({"args": fairseq_namespace(args), "model": model.state_dict()}, path)
    small_d.save(str(tmp_path / "dict.txt"))
    lm = load_model(path)
    assert lm.model.decoder.output_projection.weight.shape[0] == 24 == len(small_d)
    assert model.decoder.output_projection.weight.shape[0] == 31
    src, lengths, prev = batch(len(small_d))
    # truncating rows only removes vocabulary columns: the kept logits are unchanged
    torch.testing.assert_close(
        logits(lm.model, src, lengths, prev), logits(model, src, lengths, prev)[..., :24], **FP32
    )


# ----------------------------------------------------------------------------------------------- Hugging Face
def test_hf_config_translation_and_refusals():
    args = hf_config_to_args(
        {
            "model_type": "bart",
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 3,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 96,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 2,
            "max_position_embeddings": 100,
            "scale_embedding": True,
            "dropout": 0.2,
        },
        "config.json",
    )
    assert (
        args.encoder_embed_dim,
        args.decoder_layers,
        args.decoder_ffn_embed_dim,
        args.decoder_attention_heads,
        args.max_target_positions,
        args.no_scale_embedding,
        args.dropout,
    ) == (64, 3, 96, 2, 100, False, 0.2)
    with pytest.raises(SeqtrainError, match="not a BART or mBART config"):
        hf_config_to_args({"model_type": "t5"}, "config.json")
    with pytest.raises(SeqtrainError, match="activation_function 'silu'"):
        hf_config_to_args({"model_type": "bart", "activation_function": "silu"}, "config.json")
    with pytest.raises(SeqtrainError, match="normalize_before"):
        hf_config_to_args({"model_type": "bart", "normalize_before": True}, "config.json")


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def hf_model(transformers, scale_embedding=False, vocab=40):
    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        vocab_size=vocab,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_position_embeddings=64,
        scale_embedding=scale_embedding,
    )
    return transformers.BartForConditionalGeneration(cfg).eval()


def right_padded():
    src = torch.tensor([[0, 5, 6, 7, 8, 9, 2], [0, 11, 12, 2, 1, 1, 1]])
    prev = torch.tensor([[2, 0, 13, 14, 15], [2, 0, 16, 1, 1]])
    return src, prev


@pytest.mark.parametrize("layout", ["safetensors", "pytorch_model.bin", "safetensors_scaled"])
@pytest.mark.slow
def test_hf_import_matches_transformers(tmp_path, transformers, layout):
    hf = hf_model(transformers, scale_embedding=layout.endswith("scaled"))
    if layout == "pytorch_model.bin":  # what transformers < 4.35 wrote: config.json + a pickled state dict
        hf.config.save_pretrained(str(tmp_path))
        torch.save(hf.state_dict(), str(tmp_path / "pytorch_model.bin"))
    else:
        hf.save_pretrained(str(tmp_path))
    src, prev = right_padded()
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=src.ne(1).long(), decoder_input_ids=prev).logits
    lm = load_model(str(tmp_path))
    assert lm.format == "hf" and len(lm.tgt_dict) == 40 and lm.args.prepend_bos is True
    out = logits(lm.model, src, src.ne(1).sum(1), prev)
    mask = prev.ne(1)  # pad positions of the decoder input are not compared
    torch.testing.assert_close(out[mask], ref[mask], **FP32)


@pytest.mark.slow
def test_hf_nonzero_logits_bias_and_untied_head_refused(tmp_path, transformers):
    hf = hf_model(transformers)
    hf.save_pretrained(str(tmp_path))
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["final_logits_bias"] = torch.full((1, 40), 0.5)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SeqtrainError, match="final_logits_bias is nonzero"):
        load_model(str(tmp_path))
    weights["final_logits_bias"] = torch.zeros(1, 40)
    weights["lm_head.weight"] = torch.randn(40, 32)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SeqtrainError, match="lm_head.weight differs"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "marian", "d_model": 32}))
    with pytest.raises(SeqtrainError, match="not a BART or mBART config"):
        load_model(str(tmp_path))


def write_bpe_files(folder, as_tokenizer_json: bool):
    """A 40-id byte-level BPE vocabulary (HF ids = dictionary indices), <mask> last, as BART's."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for tok in [
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "Ġ",
        "he",
        "ll",
        "hell",
        "hello",
        "Ġw",
        "or",
        "Ġwor",
        "ld",
        "Ġworld",
    ]:
        vocab[tok] = len(vocab)
    vocab["<mask>"] = 39
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    if as_tokenizer_json:
        from tokenizers import Tokenizer, models

        Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split()) for m in merges])).save(
            str(folder / "tokenizer.json")
        )
    else:
        (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return vocab


@pytest.mark.parametrize("as_tokenizer_json", [False, True])
@pytest.mark.slow
def test_hf_import_brings_a_working_tokenizer(tmp_path, transformers, as_tokenizer_json):
    hf_model(transformers).save_pretrained(str(tmp_path))
    vocab = write_bpe_files(tmp_path, as_tokenizer_json)
    lm = load_model(str(tmp_path))
    symbols = lm.tokenizer.encode("hello world")
    ids = [lm.src_dict.index(s) for s in symbols.split()]
    assert ids == [vocab["hello"], vocab["Ġworld"]]  # dictionary index == HF token id
    assert lm.tokenizer.decode(symbols) == "hello world"
    assert lm.src_dict[39] == "<mask>" and lm.src_dict[vocab["ll"]] == str(vocab["ll"])
    export_seqtrain(lm, str(tmp_path / "st.pt"))  # the tokenizer travels inside seqtrain checkpoints
    again = load_model(str(tmp_path / "st.pt"))
    assert again.tokenizer.encode("hello world") == symbols and again.src_dict == lm.src_dict


def test_position_rows_are_cut_to_the_model_or_refused_when_too_few(tmp_path):
    """Fine-tuning with fewer positions than the checkpoint keeps the first rows; a state with fewer rows than the
    model is a clear error unless fit_positions extended it first (tests/unit/models/test_resize.py)."""
    from seqtrain.models.bart import build_model
    from seqtrain.models.resize import check_state_fits, fit_positions
    from seqtrain.registry import ARCHS

    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")

    def model(positions):
        a = argparse.Namespace(
            arch="bart_tiny", max_source_positions=positions, max_target_positions=positions
        )
        ARCHS.get("bart_tiny")(a)
        return build_model(model_config(completed(a)), d, d)

    big, small = model(64), model(16)
    state = fit_positions(big.state_dict(), small, "big.pt")
    check_state_fits(small, state, "big.pt")
    assert torch.equal(
        state["decoder.embed_positions.weight"], big.state_dict()["decoder.embed_positions.weight"][:18]
    )
    with pytest.raises(
        SeqtrainError,
        match=r"small.pt: the checkpoint has learned positions for 16 encoder tokens, "
        r"fewer than the model asks for; pass --max-source-positions 16 or less",
    ):
        check_state_fits(big, small.state_dict(), "small.pt")


def test_prenorm_model_round_trips_and_exports_as_mbart(tmp_path):
    """A pre-norm model (--encoder/--decoder-normalize-before) loads back from a seqtrain checkpoint and from a
    fairseq one with its final layer norms; its Hugging Face export is an mBART folder (pre-norm both sides;
    one side only has no Hugging Face equivalent, and export says so)."""
    from seqtrain.checkpoint.hf import export_hf

    d = make_dict(20)
    torch.manual_seed(0)
    args = argparse.Namespace(
        arch="bart_tiny",
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
        encoder_normalize_before=True,
        decoder_normalize_before=True,
    )
    model = build_model(model_config(completed(args)), d, d).eval()
    with torch.no_grad():
        model.encoder.layer_norm.weight.uniform_(0.5, 1.5)
        model.decoder.layer_norm.bias.uniform_(-0.5, 0.5)
    src, lengths, prev = batch(len(d))
    want = logits(model, src, lengths, prev)

    path = str(tmp_path / "ours.pt")
    save_checkpoint_file(make_checkpoint_state(args, model.state_dict(), d, d), path)
    lm = load_model(path)
    assert lm.model.encoder.layer_norm is not None
    torch.testing.assert_close(logits(lm.model, src, lengths, prev), want, rtol=0, atol=0)

    ns = fairseq_namespace(args)
    ns.encoder_normalize_before = ns.decoder_normalize_before = True
    (tmp_path / "fs").mkdir()
    save_checkpoint_file({"args": ns, "model": model.state_dict()}, str(tmp_path / "fs" / "model.pt"))
    d.save(str(tmp_path / "fs" / "dict.txt"))
    lm = load_model(str(tmp_path / "fs" / "model.pt"))
    torch.testing.assert_close(logits(lm.model, src, lengths, prev), want, rtol=0, atol=0)

    # pre-norm both sides: an mBART export, read back to the same logits
    export_hf(lm, str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("mbart", ["MBartForConditionalGeneration"])
    back = load_model(str(tmp_path / "hf"))
    assert not back.args.prepend_bos and back.model.decoder.layer_norm is not None
    torch.testing.assert_close(logits(back.model, src, lengths, prev), want, rtol=0, atol=0)
    lm.args.decoder_normalize_before = False
    with pytest.raises(SeqtrainError, match="need encoder_normalize_before == decoder_normalize_before"):
        export_hf(lm, str(tmp_path / "hf2"))


def _tied(rows: int) -> dict:
    emb = torch.randn(rows, 8)
    return {k: emb for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                             "decoder.output_projection.weight")}  # fmt: skip


@pytest.mark.parametrize("rows,size", [(300, 50), (50, 550), (28, 20), (20, 28)])
def test_resize_beyond_fairseq_padding_refused_unless_asked(rows, size, caplog):
    """A dictionary of another model used to cut or pad any number of rows with only an INFO line; fairseq's
    padding (to a multiple of 8) explains at most 7."""
    state = _tied(rows)
    how = f"cut {rows - size} rows" if size < rows else f"add {size - rows} new rows"
    with pytest.raises(SeqtrainError) as e:
        resize_embeddings(state, size, size, where="x.pt")
    assert str(e.value) == (
        f"x.pt: encoder.embed_tokens.weight has {rows:,} rows but the dictionary has {size:,} symbols: fitting it "
        f"would {how}, more than fairseq's dictionary padding explains (at most 7); the dictionary probably "
        "belongs to another model: give the model's own dictionary, or pass --resize-vocab to resize anyway"
    )
    with caplog.at_level(logging.INFO, logger="seqtrain.models.resize"):
        out = resize_embeddings(state, size, size, where="x.pt", allow_any=True)
    assert out["decoder.output_projection.weight"].shape == (size, 8) and len(caplog.records) == 1


@pytest.mark.parametrize("rows,size", [(27, 20), (20, 27), (51201, 50264), (50265, 50264)])
def test_resize_within_padding_or_a_released_layout_accepted(rows, size):
    """Up to 7 rows either way, bart.large's <mask> row, and bart.base's 51,201 rows with its dict.txt."""
    out = resize_embeddings(_tied(rows), size, size)
    assert out["encoder.embed_tokens.weight"].shape[0] == size
