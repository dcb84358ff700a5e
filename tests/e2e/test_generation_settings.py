"""Checkpoints remember how they are meant to be decoded (issue 50, item 3): the generation keys of a training
run's --config preset (and seqtrain-tune's choice) are stored in its checkpoints under their own key, and
seqtrain-generate, -interactive, Summarizer and the exports use them where the user gives none; the user's flags
win; older seqtrain checkpoints and fairseq's decode exactly as before."""

import io
import json
import logging

import pytest
import torch

from seqtrain import Summarizer
from seqtrain.checkpoint import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.generation_settings import KEY, STORED, with_stored
from seqtrain.checkpoint.hf import ctranslate2_options
from seqtrain.errors import SeqtrainError
from seqtrain_cli.convert import main as convert_main
from seqtrain_cli.generate import generate_main
from seqtrain_cli.interactive import interactive_main
from seqtrain_cli.train import train_main
from tests.utils import base_args

PRESET = {"beam": 3, "lenpen": 0.5, "max-len-b": 6, "no-repeat-ngram-size": 2}
# the same settings as flags, for the checkpoint that does not store them
AS_FLAGS = ["--beam", "3", "--lenpen", "0.5", "--max-len-b", "6", "--no-repeat-ngram-size", "2"]


@pytest.fixture(scope="module")
def ckpts(toy_databin, tmp_path_factory):
    """(data-bin, checkpoint trained with the preset, the same file without the stored settings (what older
    seqtrain versions wrote), the raw source lines)."""
    data = toy_databin()
    tmp = tmp_path_factory.mktemp("gen-settings")
    preset = tmp / "preset.yaml"
    preset.write_text("".join(f"{k}: {v}\n" for k, v in PRESET.items()) + "dropout: 0.0\n", encoding="utf-8")
    save = tmp / "ck"
    assert train_main(base_args(data, str(save), "--config", str(preset), "--max-update", "6")) == 0
    stored = save / "checkpoint_best.pt"
    old = tmp / "old.pt"
    save_checkpoint_file(with_stored(load_checkpoint_file(str(stored)), None), str(old))
    lines = (tmp_path_factory.getbasetemp() / "toy0" / "raw" / "valid.src").read_text().splitlines()
    return data, stored, old, lines[:12]


def _generate(path, lines, tmp_path, *flags):
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = io.StringIO()
    generate_main(["--path", str(path), "--input", str(tmp_path / "in.txt"), "--cpu", *flags], out=out)
    return out.getvalue().split("\n")[:-1]


def test_the_checkpoint_stores_the_preset_settings_under_its_own_key(ckpts):
    _, stored, old, _ = ckpts
    obj = torch.load(stored, weights_only=True)
    assert obj[KEY]["settings"] == {"beam": 3, "lenpen": 0.5, "max_len_b": 6, "no_repeat_ngram_size": 2}
    assert set(obj[KEY]["sources"].values()) == {f"the training --config {stored.parent.parent}/preset.yaml"}
    assert not set(STORED) & set(obj["args"])  # the args record keeps exactly its keys
    assert set(torch.load(old, weights_only=True)) == set(obj) - {KEY}


@pytest.mark.slow
def test_generate_uses_them_the_flags_given_win_and_the_log_says_where_each_came_from(
    ckpts, tmp_path, caplog
):
    _, stored, old, lines = ckpts
    with caplog.at_level(logging.INFO, logger="seqtrain.generate"):
        got = _generate(stored, lines, tmp_path)
    line = next(r.getMessage() for r in caplog.records if "stored in the checkpoint" in r.getMessage())
    assert line == (
        f"{stored}: generation settings stored in the checkpoint, taken: --beam 3, --lenpen 0.5, --max-len-b 6, "
        f"--no-repeat-ngram-size 2 (from the training --config {stored.parent.parent}/preset.yaml)"
    )
    assert got == _generate(old, lines, tmp_path, *AS_FLAGS)
    # the toy model's summaries depend on the settings: the stored ones changed them from the defaults
    assert got != _generate(old, lines, tmp_path)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqtrain.generate"):
        mine = _generate(stored, lines, tmp_path, "--max-len-b", "200", "--no-repeat-ngram-size", "0")
    assert mine == _generate(old, lines, tmp_path, "--beam", "3", "--lenpen", "0.5")
    assert any(
        r.getMessage().endswith(
            "taken: --beam 3, --lenpen 0.5 (from the training --config "
            f"{stored.parent.parent}/preset.yaml); given flags kept: --max-len-b 200, --no-repeat-ngram-size 0"
        )
        for r in caplog.records
    )


def test_an_older_checkpoint_decodes_with_the_defaults_as_before(ckpts, tmp_path, caplog):
    _, _, old, lines = ckpts
    with caplog.at_level(logging.INFO, logger="seqtrain.generate"):
        got = _generate(old, lines, tmp_path)
    assert not any("stored in the checkpoint" in r.getMessage() for r in caplog.records)
    defaults = ["--beam", "5", "--lenpen", "1.0", "--max-len-b", "200", "--no-repeat-ngram-size", "0"]
    assert got == _generate(old, lines, tmp_path, *defaults)


@pytest.mark.slow
def test_interactive_and_summarizer_use_them_too(ckpts, tmp_path):
    _, stored, old, lines = ckpts
    want = _generate(old, lines, tmp_path, *AS_FLAGS)
    out = io.StringIO()
    interactive_main(
        ["--path", str(stored), "--cpu", "--buffer-size", "5"], io.StringIO("\n".join(lines)), out
    )
    assert out.getvalue().split("\n")[:-1] == want
    s = Summarizer.from_pretrained(stored)
    assert s.generation_defaults == {"beam": 3, "lenpen": 0.5, "max_len_b": 6, "no_repeat_ngram_size": 2}
    assert s.summarize(lines) == want
    assert s.summarize(lines, beam=2) == Summarizer.from_pretrained(old).summarize(
        lines, beam=2, lenpen=0.5, max_len_b=6, no_repeat_ngram_size=2
    )
    assert Summarizer.from_pretrained(old).generation_defaults == {}


@pytest.mark.slow
def test_the_exports_carry_them(ckpts, tmp_path, caplog):
    """--to hf: generation_config.json (a convert flag wins); --to seqtrain: the stored key; --to fairseq: the
    values in its args (fairseq's hub interface reads them), while seqtrain reads fairseq checkpoints as before."""
    data, stored, old, lines = ckpts
    with caplog.at_level(logging.INFO, logger="seqtrain.convert"):
        convert_main([str(stored), str(tmp_path / "hf"), "--to", "hf", "--min-len", "2"])
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (gen["num_beams"], gen["length_penalty"], gen["max_length"]) == (3, 0.5, 8)
    assert (gen["no_repeat_ngram_size"], gen["min_length"]) == (2, 3)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "beam 3 (stored in the checkpoint, from the training --config" in logged
    assert "min_len 2 (--min-len)" in logged
    assert ctranslate2_options(str(tmp_path / "hf")) == dict(
        beam_size=3, length_penalty=0.5, max_decoding_length=7, min_decoding_length=2, no_repeat_ngram_size=2
    )
    # the Hugging Face folder decodes as the checkpoint does (its generation_config.json: the same settings;
    # the toy model has no tokenizer to export, so its words come from the data-bin's dictionary)
    want = _generate(stored, lines, tmp_path, "--min-len", "2")
    assert _generate(tmp_path / "hf", lines, tmp_path, data) == want

    convert_main([str(stored), str(tmp_path / "re.pt"), "--to", "seqtrain", "--beam", "2"])
    obj = torch.load(tmp_path / "re.pt", weights_only=True)
    assert obj[KEY]["settings"] == {"beam": 2, "lenpen": 0.5, "max_len_b": 6, "no_repeat_ngram_size": 2}
    assert obj[KEY]["sources"]["beam"] == "seqtrain-convert --beam"
    convert_main([str(old), str(tmp_path / "old-re.pt"), "--to", "seqtrain"])
    assert KEY not in torch.load(tmp_path / "old-re.pt", weights_only=True)

    convert_main([str(stored), str(tmp_path / "fs" / "model.pt"), "--to", "fairseq"])
    args = load_checkpoint_file(str(tmp_path / "fs" / "model.pt"), unsafe=True)["args"]
    assert (args.beam, args.lenpen, args.max_len_b, args.no_repeat_ngram_size) == (3, 0.5, 6, 2)
    # a fairseq checkpoint decodes with the defaults, as before
    fs = _generate(tmp_path / "fs" / "model.pt", lines, tmp_path, "--unsafe-load")
    assert fs == _generate(old, lines, tmp_path)


def test_a_malformed_entry_is_refused_naming_the_file(ckpts, tmp_path):
    _, stored, _, lines = ckpts
    obj = load_checkpoint_file(str(stored))
    obj[KEY] = {"settings": {"beam": 0}, "sources": {}}
    save_checkpoint_file(obj, str(tmp_path / "bad.pt"))
    with pytest.raises(SeqtrainError, match=r"bad.pt: stored generation settings \(beam\): beam 0 is out of"):
        Summarizer.from_pretrained(tmp_path / "bad.pt")
    obj[KEY] = {"settings": {"sampling": True}}
    save_checkpoint_file(obj, str(tmp_path / "bad.pt"))
    with pytest.raises(SeqtrainError, match="'sampling' is not a stored generation setting"):
        _generate(tmp_path / "bad.pt", lines, tmp_path)


def test_averaging_keeps_them(ckpts):
    from seqtrain.checkpoint.average import average_checkpoints

    _, stored, old, _ = ckpts
    assert average_checkpoints([str(stored), str(old)])[KEY] == torch.load(stored, weights_only=True)[KEY]
    assert KEY not in average_checkpoints(
        [str(old), str(stored)]
    )  # the first input's, as every other setting


@pytest.mark.slow
def test_the_server_takes_them_as_its_defaults_under_its_flags(ckpts, tmp_path):
    """seqtrain-serve loads through the same runner: the checkpoint's settings are every request's defaults,
    the server's own flags (here --beam 3 --max-len-b 8) win."""
    pytest.importorskip("uvicorn", reason="seqtrain-serve needs seqtrain[serve]")
    from tests.e2e.test_serve import start, stop

    server = start(str(ckpts[1]), tmp_path)
    try:
        status, _, body = server.request("GET", "/v1/info")
        assert status == 200
        defaults = json.loads(body)["defaults"]
        assert (defaults["beam"], defaults["max_len_b"]) == (3, 8)  # the server's flags
        assert (defaults["lenpen"], defaults["no_repeat_ngram_size"]) == (0.5, 2)  # the checkpoint's
    finally:
        assert stop(server) == 0
