"""The released-BART user story, end to end on files made here (no downloads):
GPT-2 BPE + BART-style dict.txt -> seqtrain-preprocess -> seqtrain-train --finetune-from-model a fairseq model.pt
whose embedding has more rows than the dictionary (as bart.base's 51201) -> seqtrain-generate writes text."""

import argparse
import io
import logging

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.checkpoint.files import load_checkpoint_file
from tests.utils import SAMPLE, completed

DIMS = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]
EXTRA_ROWS = 5  # bart.base's embedding is padded past its dict.txt in the same way


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """encoder.json, vocab.bpe, dict.txt and a fairseq-layout model.pt, like a bart.base download."""
    from tokenizers import ByteLevelBPETokenizer

    from seqtrain.data.dictionary import Dictionary
    from seqtrain.models.bart import build_model
    from seqtrain_cli.preprocess import preprocess_main as preprocess

    folder = tmp_path_factory.mktemp("released")
    raw = folder / "raw"
    raw.mkdir()
    for split, n in (("train", 300), ("valid", 20), ("test", 10)):
        for side in ("source", "target"):
            lines = (SAMPLE / f"{split}.{side}").read_text(encoding="utf-8").split("\n")[:n]
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        (raw / "train.source").read_text(encoding="utf-8").split("\n"),
        vocab_size=600,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    bpe.save_model(str(folder))
    (folder / "vocab.json").rename(folder / "encoder.json")
    (folder / "merges.txt").rename(folder / "vocab.bpe")
    gpt2 = [
        "--tokenizer",
        "gpt2",
        "--gpt2-encoder-json",
        str(folder / "encoder.json"),
        "--gpt2-vocab-bpe",
        str(folder / "vocab.bpe"),
    ]
    # the "released" dict.txt: GPT-2 ids as strings with counts, as BART's dict.txt
    preprocess(
        [
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(folder / "dictbin"),
            "--joined-dictionary",
            "--dict-only",
            "--no-progress-bar",
            *gpt2,
        ]
    )
    (folder / "dict.txt").write_bytes((folder / "dictbin" / "dict.source.txt").read_bytes())
    d = Dictionary.load(str(folder / "dict.txt"))
    assert all(s.isdigit() for s in d.symbols[4:] if not s.startswith("madeupword"))
    # the "released" model: fairseq names, an `args` Namespace, EXTRA_ROWS more embedding rows than dict.txt
    big = Dictionary.load(str(folder / "dict.txt"))
    for i in range(EXTRA_ROWS):
        big.add_symbol(f"<extra{i}>")
    p = argparse.ArgumentParser()
    for flag in DIMS[::2]:
        p.add_argument(flag, type=int)
    margs = p.parse_args(DIMS)
    margs.arch = "bart_base"
    torch.manual_seed(0)
    model = build_model(model_config(completed(argparse.Namespace(**vars(margs)))), big, big)
    from seqtrain.registry import ARCHS

    ARCHS.get("bart_base")(margs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["encoder.version"] = torch.tensor([3.0])
    state["decoder.version"] = torch.tensor([3.0])
    torch.save(
        {"args": margs, "model": state, "optimizer_history": [], "extra_state": {}}, folder / "model.pt"
    )
    # the user's data, binarized with the released dictionary
    preprocess(
        [
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--testpref",
            str(raw / "test"),
            "--destdir",
            str(folder / "data-bin"),
            "--srcdict",
            str(folder / "dict.txt"),
            "--tgtdict",
            str(folder / "dict.txt"),
            "--no-progress-bar",
            *gpt2,
        ]
    )
    return folder, state, len(d)


@pytest.mark.slow
def test_finetune_from_released_fairseq_model_with_more_embedding_rows(released, tmp_path, caplog):
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.train import train_main

    folder, state, n_dict = released
    save = tmp_path / "ck"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level(logging.INFO):
            # sgd with lr 0: the weights after one update are the loaded ones, comparable exactly
            train_main(
                [
                    str(folder / "data-bin"),
                    "--arch",
                    "bart_base",
                    *DIMS,
                    "--finetune-from-model",
                    str(folder / "model.pt"),
                    "--optimizer",
                    "sgd",
                    "--lr",
                    "0",
                    "--max-update",
                    "1",
                    "--max-tokens",
                    "4096",
                    "--truncate-source",
                    "--max-source-positions",
                    "256",
                    "--cpu",
                    "--log-format",
                    "none",
                    "--save-dir",
                    str(save),
                    "--no-epoch-checkpoints",
                ]
            )
        ours = load_checkpoint_file(str(save / "checkpoint_last.pt"))["model"]
        emb = ours["encoder.embed_tokens.weight"]
        assert emb.shape[0] == n_dict  # cut to the dictionary
        assert torch.equal(emb, state["encoder.embed_tokens.weight"][:n_dict])
        assert torch.equal(ours["decoder.output_projection.weight"], emb)
        assert torch.equal(ours["encoder.layers.0.fc1.weight"], state["encoder.layers.0.fc1.weight"])
        msgs = [r.getMessage() for r in caplog.records]
        resize = [m for m in msgs if "resized vocabulary embeddings" in m]
        assert len(resize) == 1 and f"truncated {EXTRA_ROWS} rows" in resize[0], resize
        # --max-source-positions 256 keeps the first 258 of the released 1026 position rows
        assert torch.equal(
            ours["encoder.embed_positions.weight"], state["encoder.embed_positions.weight"][:258]
        )
        assert any("encoder 1026->258" in m for m in msgs)
        # generation with nothing but the checkpoint: it carries the GPT-2 tokenizer and decodes to text
        out = io.StringIO()
        r = generate_main(
            [
                str(folder / "data-bin"),
                "--path",
                str(save / "checkpoint_last.pt"),
                "--beam",
                "2",
                "--max-len-b",
                "8",
                "--batch-size",
                "5",
            ],
            out=out,
        )
    finally:
        torch.set_num_threads(threads)
    assert len(r["hypotheses"]) == 10
    assert sum(line.startswith("D-") for line in out.getvalue().split("\n")) == 10
    # H- lines are GPT-2 ids (dictionary symbols); the decoded text is not a list of numbers
    h_lines = [line.split("\t")[2] for line in out.getvalue().split("\n") if line.startswith("H-")]
    assert all(all(tok.isdigit() for tok in h.split()) for h in h_lines)
    assert any(not h.replace(" ", "").isdigit() for h in r["hypotheses"] if h)
