"""Parity with fairseq 0.12 itself: its checkpoint loads safely and gives the logits fairseq computed."""

import argparse

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.checkpoint.hf import export_hf
from seqtrain.checkpoint.load import load_model
from tests.utils import FP32


def test_fixture_checkpoint_loads_safely(fairseq_tiny):
    raw = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"))  # weights_only with our allowlist
    assert raw["args"] is None and isinstance(raw["cfg"]["model"], argparse.Namespace)
    ck = read_checkpoint(str(fairseq_tiny / "checkpoint_last.pt"), dict_path=str(fairseq_tiny / "data-bin"))
    assert ck.format == "fairseq" and ck.args.arch == "bart_base" and ck.args.encoder_embed_dim == 128
    assert ck.args.left_pad_source is True and len(ck.src_dict) == 208
    assert "encoder.version" not in ck.model


def test_fixture_logits_match_fairseq(fairseq_tiny):
    lm = load_model(
        str(fairseq_tiny / "checkpoint_last.pt"), dict_path=str(fairseq_tiny / "data-bin" / "dict.src.txt")
    )
    refs = torch.load(str(fairseq_tiny / "reference_forward.pt"), weights_only=True)
    assert len(refs) == 5
    with torch.no_grad():
        for ref in refs:
            out, _ = lm.model(ref["src_tokens"], ref["src_lengths"], ref["prev_output_tokens"])
            assert out.shape == ref["logits"].shape
            torch.testing.assert_close(out, ref["logits"], **FP32)


@pytest.mark.slow
def test_fixture_exported_to_hf_matches_fairseq(fairseq_tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    lm = load_model(str(fairseq_tiny / "checkpoint_last.pt"), dict_path=str(fairseq_tiny / "data-bin"))
    export_hf(lm, str(tmp_path))
    hf = transformers.BartForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    ref = torch.load(str(fairseq_tiny / "reference_forward.pt"), weights_only=True)[
        0
    ]  # one example, no padding
    with torch.no_grad():
        out = hf(input_ids=ref["src_tokens"], decoder_input_ids=ref["prev_output_tokens"]).logits
    torch.testing.assert_close(out, ref["logits"], **FP32)
