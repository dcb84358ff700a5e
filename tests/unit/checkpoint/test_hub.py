"""Hub names (`org/name[@revision]`) for every flag that takes a model, resolved offline through a Hugging Face
cache this module builds in huggingface_hub's on-disk layout (models--ORG--NAME/{blobs, refs, snapshots}): a
transformers BART folder saved from a tiny made model, and a fairseq-style folder (model.pt + dict.txt)."""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pathlib
import shutil
import sys

import pytest
import torch

from seqtrain.checkpoint.fairseq import export_fairseq, model_config
from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.checkpoint.hub import hub_cache_dir, parse_hub_name, resolve_model_path
from seqtrain.checkpoint.load import LoadedModel, load_model
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.generation.generate import generate
from seqtrain.generation.options import parse_generation_args
from seqtrain.models.bart import build_model
from seqtrain_cli.convert import main as convert_main
from seqtrain_cli.train import train_main
from tests.utils import FP32, base_args, completed

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

SHA_MAIN, SHA_V1, SHA_FQ = "a" * 40, "b" * 40, "c" * 40


def put_in_cache(
    cache: pathlib.Path, repo: str, sha: str, files: dict[str, pathlib.Path], refs: tuple
) -> None:
    """`files` as huggingface_hub stores a download: content-addressed blobs, the snapshot's names linking to
    them, each ref a file holding the commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    for name, src in files.items():
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        shutil.copyfile(src, root / "blobs" / digest)
        os.symlink(os.path.join("..", "..", "blobs", digest), snap / name)
    for ref in refs:
        (root / "refs" / ref).write_text(sha)


def tiny_hf_bart(seed: int) -> transformers.BartForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
    )
    return transformers.BartForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, toy_databin):
    """(cache folder, {name: reference}): org/tiny-bart at main and v1 (two different models), its v1 folder also
    holding a pytorch_model.bin of other weights, and org/tiny-fairseq (bart_tiny for the toy data-bin)."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    made = {}
    for sha, refs, seed in ((SHA_MAIN, ("main",), 0), (SHA_V1, ("v1",), 1)):
        folder = root / f"hf{seed}"
        model = tiny_hf_bart(seed)
        model.save_pretrained(folder)  # config.json + model.safetensors
        files = {n: folder / n for n in os.listdir(folder)}
        if sha == SHA_V1:  # safetensors wins over pytorch_model.bin
            torch.save(tiny_hf_bart(7).state_dict(), root / "other.bin")
            files["pytorch_model.bin"] = root / "other.bin"
        put_in_cache(cache, "org/tiny-bart", sha, files, refs)
        made[refs[0]] = model
    data = toy_databin()
    d = Dictionary.load(os.path.join(data, "dict.src.txt"))
    args = argparse.Namespace(arch="bart_tiny")
    torch.manual_seed(3)
    model = build_model(model_config(completed(args)), d, d).eval()
    fq = root / "fairseq" / "model.pt"
    fq.parent.mkdir()
    export_fairseq(LoadedModel(model, args, d, d), str(fq))
    put_in_cache(
        cache, "org/tiny-fairseq", SHA_FQ, {n: fq.parent / n for n in ("model.pt", "dict.txt")}, ("main",)
    )
    made["fairseq"] = str(fq)
    return cache, made, data


@pytest.fixture
def offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub[0]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


def hf_logits(model, ours) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[0, 5, 9, 12, 2], [0, 7, 8, 2, 1]])
    prev = torch.tensor([[2, 0, 6, 11], [2, 0, 9, 1]])
    real = prev.ne(1)
    with torch.no_grad():
        ref = model(input_ids=src, attention_mask=src.ne(1).long(), decoder_input_ids=prev).logits
        got = ours(src, None, prev)[0]
    return got[real], ref[real]


def test_names_that_are_hub_names_and_those_that_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_name("facebook/bart-large-cnn") == ("facebook/bart-large-cnn", None)
    assert parse_hub_name("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_name("org/name@refs/pr/3") == ("org/name", "refs/pr/3")
    for local in ("checkpoints/checkpoint_best.pt", "/abs/model", "model.pt", "a--b/c", "a/../b", "x/y/z"):
        assert parse_hub_name(local) is None, local
    (tmp_path / "runs").mkdir()
    assert parse_hub_name("runs/best") is None  # an existing local folder: a local path, missing or not
    assert resolve_model_path("runs/best") == "runs/best"


def test_hf_folder_by_name_and_revision_matches_transformers(offline):
    cache, made, _ = offline
    lm = load_model("org/tiny-bart")
    assert lm.format == "hf" and lm.args.prepend_bos
    assert os.path.realpath(resolve_model_path("org/tiny-bart")) == str(
        (cache / "models--org--tiny-bart" / "snapshots" / SHA_MAIN).resolve()
    )
    got, ref = hf_logits(made["main"], lm.model)
    torch.testing.assert_close(got, ref, **FP32)
    # the tag: another model; its snapshot also holds a pytorch_model.bin of other weights, and safetensors wins
    for name in ("org/tiny-bart@v1", f"org/tiny-bart@{SHA_V1}"):
        got, ref = hf_logits(made["v1"], load_model(name).model)
        torch.testing.assert_close(got, ref, **FP32)


def test_hf_home_gives_the_cache_when_hf_hub_cache_is_unset(hub, tmp_path, monkeypatch):
    cache, made, _ = hub
    os.symlink(cache, tmp_path / "hub")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_cache_dir() == str(tmp_path / "hub")
    got, ref = hf_logits(made["main"], load_model("org/tiny-bart").model)
    torch.testing.assert_close(got, ref, **FP32)


def test_a_local_path_wins_over_the_hub_name(offline, tmp_path, monkeypatch):
    _, made, _ = offline
    monkeypatch.chdir(tmp_path)
    tiny_hf_bart(5).save_pretrained(tmp_path / "org" / "tiny-bart")
    got, ref = hf_logits(tiny_hf_bart(5), load_model("org/tiny-bart").model)
    torch.testing.assert_close(got, ref, **FP32)
    got, ref = hf_logits(made["main"], load_model("org/tiny-bart").model)
    assert not torch.allclose(got, ref)


def test_fairseq_folder_generates_as_its_local_file(offline):
    _, made, data = offline
    lm = load_model("org/tiny-fairseq")
    assert lm.format == "fairseq" and len(lm.src_dict) == len(
        Dictionary.load(os.path.join(data, "dict.src.txt"))
    )
    local = load_checkpoint_file(made["fairseq"])["model"]
    assert all(torch.equal(v, local[k]) for k, v in lm.model.state_dict().items())

    def hypotheses(path: str) -> list[str]:
        argv = [data, "--path", path, "--gen-subset", "valid", "--beam", "2", "--cpu", "--max-len-b", "6"]
        return [
            line
            for line in generate(parse_generation_args(argv), out=io.StringIO())["lines"]
            if line[0] == "H"
        ]

    hyps = hypotheses("org/tiny-fairseq")
    assert len(hyps) == 40 and hyps == hypotheses(made["fairseq"])


def test_summarizer_and_convert_take_hub_names(offline, tmp_path):
    from seqtrain import Summarizer

    _, made, data = offline
    s = Summarizer.from_pretrained("org/tiny-fairseq")
    ref = Summarizer.from_pretrained(made["fairseq"])
    assert s.summarize(["w1 w2 w3 w4 w5"], beam=2) == ref.summarize(["w1 w2 w3 w4 w5"], beam=2)
    out = tmp_path / "converted.pt"
    convert_main(["org/tiny-bart@v1", str(out), "--to", "seqtrain"])
    got, want = hf_logits(made["v1"], load_model(str(out)).model)
    torch.testing.assert_close(got, want, **FP32)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--finetune-from-model", "--restore-file"])
def test_training_starts_from_a_hub_model(offline, tmp_path, flag):
    _, made, data = offline
    save = str(tmp_path / "run")
    # sgd with lr 0 leaves the weights as loaded, so they compare bitwise after one update
    ft = ["--optimizer", "sgd", "--lr", "0", "--max-update", "1", "--no-epoch-checkpoints"]
    assert train_main(base_args(data, save, flag, "org/tiny-fairseq", *ft)) == 0
    state = load_checkpoint_file(os.path.join(save, "checkpoint_last.pt"))["model"]
    source = load_checkpoint_file(made["fairseq"])["model"]
    assert all(torch.equal(state[k], source[k]) for k in state if k in source)


def test_absent_offline_and_without_huggingface_hub(offline, monkeypatch):
    cache = offline[0]
    with pytest.raises(SeqtrainError) as e:
        load_model("org/missing@v2")
    msg = str(e.value)
    assert "\n" not in msg and "org/missing" in msg and str(cache) in msg and "revision v2" in msg
    with pytest.raises(
        SeqtrainError, match=r"--path org/missing: hub model org/missing .* not in the Hugging Face"
    ):
        generate(parse_generation_args(["--path", "org/missing", "--input", "-", "--cpu"]), out=io.StringIO())
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if not installed
    with pytest.raises(
        SeqtrainError, match=r"org/tiny-bart: no such local path.*pip install huggingface_hub"
    ):
        load_model("org/tiny-bart")
