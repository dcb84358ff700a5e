"""seqtrain-convert: fairseq / seqtrain / Hugging Face in every direction, checked by logits and bytes."""

import argparse
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.load import load_model
from seqtrain.data.dictionary import Dictionary
from seqtrain.models.bart import build_model
from seqtrain_cli.convert import cli_main
from tests.utils import FP32, completed


def make_dict(n_words: int) -> Dictionary:
    d = Dictionary()
    for i in range(n_words):
        d.add_symbol(f"w{i}", n=100 - i)
    return d


def convert(*argv: str) -> int:
    with pytest.raises(SystemExit) as e:
        cli_main(list(argv))
    return e.value.code


@pytest.fixture
def fairseq_ckpt(tmp_path):
    """A fairseq-layout checkpoint (cfg dict with a Namespace, version entries) and its dict.txt."""
    d = make_dict(28)
    torch.manual_seed(0)
    args = argparse.Namespace(arch="bart_tiny", encoder_layers=2, decoder_layers=1, dropout=0.0)
    model = build_model(model_config(completed(args)), d, d).eval()
    args.lr, args.task, args.no_scale_embedding = [0.001], "translation", True
    state = dict(model.state_dict())
    state["encoder.version"] = state["decoder.version"] = torch.tensor([3.0])
    folder = tmp_path / "fq"
    folder.mkdir()
    save_checkpoint_file(
        {"args": None, "cfg": {"model": args}, "model": state, "extra_state": {}},
        str(folder / "checkpoint.pt"),
    )
    d.save(str(folder / "dict.txt"))
    return folder / "checkpoint.pt", model, d


def right_padded():
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [11, 12, 2, 1, 1, 1]])
    prev = torch.tensor([[2, 13, 14, 15], [2, 16, 1, 1]])
    return src, prev


@pytest.mark.slow
def test_to_hf_loads_in_transformers_with_same_logits(tmp_path, fairseq_ckpt):
    transformers = pytest.importorskip("transformers")
    ckpt, model, d = fairseq_ckpt
    out = tmp_path / "hf"
    # no --dict and none needed: a folder without dict.txt
    os.rename(ckpt.parent / "dict.txt", tmp_path / "elsewhere.txt")
    assert convert(str(ckpt), str(out), "--to", "hf") == 0
    # no tokenizer with this checkpoint (its symbols are w0, w1, ...): no tokenizer files
    assert sorted(os.listdir(out)) == [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    gen = json.loads((out / "generation_config.json").read_text())  # seqtrain-generate's defaults
    assert (gen["num_beams"], gen["length_penalty"], gen["min_length"], gen["no_repeat_ngram_size"]) == (
        5,
        1.0,
        2,
        0,
    )
    assert gen["max_length"] == min(200, model.decoder.max_target_positions - 1) + 2
    config = json.loads((out / "config.json").read_text())
    assert (
        config["model_type"],
        config["vocab_size"],
        config["d_model"],
        config["encoder_layers"],
        config["decoder_layers"],
    ) == ("bart", 32, 64, 2, 1)
    hf = transformers.BartForConditionalGeneration.from_pretrained(str(out)).eval()
    src, prev = right_padded()
    with torch.no_grad():
        ref = model(src, src.ne(1).sum(1), prev)[0]
        got = hf(input_ids=src, attention_mask=src.ne(1).long(), decoder_input_ids=prev).logits
    mask = prev.ne(1)
    torch.testing.assert_close(got[mask], ref[mask], **FP32)
    # and back: HF folder -> seqtrain model with the same logits
    back = load_model(str(out))
    with torch.no_grad():
        again = back.model(src, src.ne(1).sum(1), prev)[0]
    torch.testing.assert_close(again[mask], ref[mask], **FP32)


def test_to_fairseq_and_seqtrain_round_trip(tmp_path, fairseq_ckpt):
    ckpt, model, d = fairseq_ckpt
    st = tmp_path / "st.pt"
    assert convert(str(ckpt), str(st), "--to", "seqtrain") == 0  # dict.txt found next to the checkpoint
    raw = load_checkpoint_file(str(st))
    assert raw["format"] == "seqtrain" and raw["src_dict"] == d.to_list() and isinstance(raw["args"], dict)
    assert raw["args"]["encoder_layers"] == 2 and "lr" not in raw["args"]
    fq = tmp_path / "out" / "model.pt"
    assert convert(str(st), str(fq), "--to", "fairseq") == 0
    raw_fq = load_checkpoint_file(str(fq))
    # bart_tiny is seqtrain's: exported as fairseq's bart_base with every dimension explicit
    assert isinstance(raw_fq["args"], argparse.Namespace) and raw_fq["args"].arch == "bart_base"
    assert (raw_fq["args"].encoder_embed_dim, raw_fq["args"].encoder_layers) == (64, 2)
    assert raw_fq["model"]["encoder.version"].item() == 3.0
    assert Dictionary.load(str(fq.parent / "dict.txt")) == d
    lm = load_model(str(fq))
    for k, v in model.state_dict().items():
        assert torch.equal(lm.model.state_dict()[k], v), k
    src, prev = right_padded()
    with torch.no_grad():
        torch.testing.assert_close(
            lm.model(src, src.ne(1).sum(1), prev)[0], model(src, src.ne(1).sum(1), prev)[0], rtol=0, atol=0
        )


def test_convert_errors(tmp_path, fairseq_ckpt, capsys):
    ckpt, model, d = fairseq_ckpt
    os.remove(ckpt.parent / "dict.txt")
    assert convert(str(ckpt), str(tmp_path / "x.pt"), "--to", "seqtrain") == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("seqtrain-convert: error: ") and "--dict" in err and len(err.strip().splitlines()) == 1
    )
    assert not (tmp_path / "x.pt").exists()
    assert convert(str(ckpt), str(tmp_path / "x.pt"), "--to", "seqtrain", "--from", "hf") == 1
    assert "config.json" in capsys.readouterr().err
    d.save(str(tmp_path / "mydict.txt"))
    assert (
        convert(str(ckpt), str(tmp_path / "x.pt"), "--to", "seqtrain", "--dict", str(tmp_path / "mydict.txt"))
        == 0
    )
    assert load_model(str(tmp_path / "x.pt")).src_dict == d


def test_dictionary_of_another_size_refused_unless_resize_vocab(tmp_path, fairseq_ckpt, capsys):
    """A dict.txt of another model (300 symbols for 32 rows) used to pad 268 rows with an INFO line."""
    ckpt, model, d = fairseq_ckpt
    other = make_dict(296)  # + 4 specials = 300
    other.save(str(tmp_path / "other.txt"))
    out = tmp_path / "x.pt"
    argv = [str(ckpt), str(out), "--to", "seqtrain", "--dict", str(tmp_path / "other.txt")]
    assert convert(*argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"seqtrain-convert: error: {ckpt}: encoder.embed_tokens.weight has 32 rows but the dictionary has 300 "
        "symbols: fitting it would add 268 new rows, more than fairseq's dictionary padding explains (at most 7); "
        "the dictionary probably belongs to another model: give the model's own dictionary, or pass "
        "--resize-vocab to resize anyway"
    ]
    assert not out.exists()
    assert convert(*argv, "--resize-vocab") == 0
    lm = load_model(str(out))
    assert len(lm.src_dict) == 300 and lm.model.encoder.embed_tokens.weight.shape[0] == 300


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_unsafe_load_flag(tmp_path, fairseq_ckpt, capsys):
    ckpt, model, d = fairseq_ckpt
    obj = load_checkpoint_file(str(ckpt))
    marker = str(tmp_path / "ran")
    obj["extra_state"]["hook"] = _Marker(marker)
    save_checkpoint_file(obj, str(ckpt))
    assert convert(str(ckpt), str(tmp_path / "x.pt"), "--to", "seqtrain") == 1
    assert "--unsafe-load" in capsys.readouterr().err and not os.path.exists(marker)
    assert convert(str(ckpt), str(tmp_path / "x.pt"), "--to", "seqtrain", "--unsafe-load") == 0
    assert os.path.isdir(marker) and load_checkpoint_file(str(tmp_path / "x.pt"))["format"] == "seqtrain"


def test_to_hf_generation_settings_from_flags_the_run_or_defaults(tmp_path, fairseq_ckpt, caplog, capsys):
    """generation_config.json: a convert flag given wins, then the run's --eval-rouge-args (JSON or flags), then
    seqtrain-generate's defaults; a Hugging Face input passes its own on; the log says where each came from."""
    ckpt, model, d = fairseq_ckpt
    st = tmp_path / "st.pt"
    assert convert(str(ckpt), str(st), "--to", "seqtrain") == 0
    raw = load_checkpoint_file(str(st))

    def export(run_args, *flags):
        raw["args"]["eval_rouge"] = True
        raw["args"]["eval_rouge_args"] = run_args
        save_checkpoint_file(raw, str(st))
        out = tmp_path / f"hf{len(os.listdir(tmp_path))}"
        with caplog.at_level("INFO"):
            assert convert(str(st), str(out), "--to", "hf", *flags) == 0
        return out, json.loads((out / "generation_config.json").read_text())

    def key(g):
        return (
            g["num_beams"],
            g["length_penalty"],
            g["max_length"],
            g["min_length"],
            g["no_repeat_ngram_size"],
        )

    out, gen = export('{"beam": 3, "max_len_b": 30, "no_repeat_ngram_size": 3, "sampling": false}')
    assert key(gen) == (3, 1.0, 32, 2, 3)
    line = next(r.getMessage() for r in caplog.records if "generation_config.json from" in r.getMessage())
    assert (
        "beam 3 (the run's --eval-rouge-args)" in line and "lenpen 1.0 (seqtrain-generate's defaults)" in line
    )
    cap = min(200, model.decoder.max_target_positions - 1) + 2  # max-len-b 200, capped at the positions
    assert key(export("--beam 2 --lenpen 2.0 --min-len 4", "--beam", "6")[1]) == (6, 2.0, cap, 5, 0)
    # a Hugging Face input's generation_config.json carries over (read back as seqtrain flags, written again)
    again = tmp_path / "again"
    assert convert(str(out), str(again), "--to", "hf") == 0
    assert key(json.loads((again / "generation_config.json").read_text())) == (3, 1.0, 32, 2, 3)
    # a value out of the command line's range is one line naming the run's setting
    raw["args"]["eval_rouge_args"] = '{"beam": 0}'
    save_checkpoint_file(raw, str(st))
    with pytest.raises(SystemExit) as e:
        cli_main([str(st), str(tmp_path / "bad"), "--to", "hf"])
    assert e.value.code == 1 and not (tmp_path / "bad").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"seqtrain-convert: error: {st}: the run's --eval-rouge-args: beam 0"
    )


def test_to_hf_takes_the_run_presets_search_settings(tmp_path, fairseq_ckpt, caplog):
    """A run trained with --config PRESET (configs/debdesc_small.yaml: beam 4, max-len-b 30, no repeated
    trigrams) exports those settings without convert flags: what seqtrain-generate --config PRESET uses. A flag
    still wins; a preset that is gone leaves seqtrain-generate's defaults."""
    ckpt, _, _ = fairseq_ckpt
    st = tmp_path / "st.pt"
    assert convert(str(ckpt), str(st), "--to", "seqtrain") == 0
    raw = load_checkpoint_file(str(st))
    preset = tmp_path / "preset.yaml"
    preset.write_text(
        "arch: bart_base\nlr: 0.001\nbeam: 4\nmax-len-b: 30\nno-repeat-ngram-size: 3\nlenpen: 1.5\n"
    )
    raw["args"]["config"] = str(preset)
    save_checkpoint_file(raw, str(st))

    def export(*flags):
        out = tmp_path / f"hf{len(os.listdir(tmp_path))}"
        caplog.clear()
        with caplog.at_level("INFO"):
            assert convert(str(st), str(out), "--to", "hf", *flags) == 0
        g = json.loads((out / "generation_config.json").read_text())
        return (g["num_beams"], g["length_penalty"], g["max_length"], g["no_repeat_ngram_size"])

    assert export() == (4, 1.5, 32, 3)
    line = next(r.getMessage() for r in caplog.records if "generation_config.json from" in r.getMessage())
    assert (
        f"beam 4 (the run's --config {preset})" in line and "min_len 1 (seqtrain-generate's defaults)" in line
    )
    assert export("--beam", "2") == (2, 1.5, 32, 3)
    preset.unlink()
    assert export()[0] == 5  # seqtrain-generate's default beam


def test_dtype_float16_halves_the_weights_and_loads_back_rounded(tmp_path, fairseq_ckpt):
    """--dtype float16: the file holds float16 tensors (half the bytes), and loading gives a float32 model whose
    weights are the original ones rounded to float16."""
    ckpt, model, d = fairseq_ckpt
    full, half = tmp_path / "hf32", tmp_path / "hf16"
    assert convert(str(ckpt), str(full), "--to", "hf") == 0
    assert convert(str(ckpt), str(half), "--to", "hf", "--dtype", "float16") == 0
    tensors = load_file(str(half / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.float16}
    assert json.loads((half / "config.json").read_text())["torch_dtype"] == "float16"
    assert json.loads((full / "config.json").read_text())["torch_dtype"] == "float32"
    size32, size16 = (os.path.getsize(f / "model.safetensors") for f in (full, half))
    assert 0.49 < size16 / size32 < 0.51
    st = tmp_path / "st16.pt"
    assert convert(str(ckpt), str(st), "--to", "seqtrain", "--dtype", "float16") == 0
    for path in (str(half), str(st)):
        back = load_model(path).model.state_dict()
        for k, v in model.state_dict().items():
            assert back[k].dtype == torch.float32, k
            assert torch.equal(back[k], v.half().float()), (path, k)


def test_conversion_logs_name_the_architecture_the_file_stores(tmp_path, fairseq_ckpt, caplog):
    """Issue 40: a --to fairseq export of a seqtrain-only size logged the source's arch (bart_tiny) while the file
    stores fairseq's bart_base; a Hugging Face model of a width no preset has (32) was labelled bart_large on the
    way back. The 'wrote' line names what the written file stores, and the label is the nearest preset's."""
    import logging

    ckpt, _, _ = fairseq_ckpt
    fq = tmp_path / "out" / "model.pt"
    with caplog.at_level(logging.INFO):
        assert convert(str(ckpt), str(fq), "--to", "fairseq") == 0
    stored = load_checkpoint_file(str(fq))["args"].arch
    wrote = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"wrote {fq}")]
    assert stored == "bart_base" and len(wrote) == 1 and f"arch {stored}, d_model 64, 2+1 layers" in wrote[0]
    d = make_dict(20)
    args = argparse.Namespace(
        arch="bart_tiny", encoder_embed_dim=32, decoder_embed_dim=32, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64,
    )  # fmt: skip
    state = {
        "format": "seqtrain",
        "args": vars(args),
        "model": build_model(model_config(completed(args)), d, d).state_dict(),
    }
    state.update(src_dict=d.to_list(), tgt_dict=d.to_list())
    save_checkpoint_file(state, str(tmp_path / "narrow.pt"))
    assert convert(str(tmp_path / "narrow.pt"), str(tmp_path / "hf"), "--to", "hf") == 0
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert convert(str(tmp_path / "hf"), str(tmp_path / "back.pt"), "--to", "seqtrain") == 0
    stored = load_checkpoint_file(str(tmp_path / "back.pt"))["args"]["arch"]
    wrote = [r.getMessage() for r in caplog.records if r.getMessage().startswith("wrote ")]
    assert stored == "bart_tiny" and "arch bart_tiny, d_model 32" in wrote[0], wrote
