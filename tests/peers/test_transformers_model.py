"""Parity with Hugging Face transformers' BartForConditionalGeneration (random weights, no downloads).

HF and fairseq BART are the same network with different parameter names; HF positions are absolute (0..S-1
plus an offset of 2), fairseq's count non-pad tokens from padding_idx + 1. Both agree for right-padded inputs, so
the comparison uses right-padded sources and right-padded decoder rows of different lengths, and compares the
logits at real (non-pad) decoder positions only.
"""

import pytest
import torch

from seqtrain.models.bart import BartConfig, BARTModel
from tests.utils import FP32

transformers = pytest.importorskip("transformers")

PAD, EOS = 1, 2


def hf_to_seqtrain(hf_state: dict) -> dict:
    """Minimal HF -> seqtrain name mapping (the full importer lives in seqtrain/checkpoint/hf.py)."""
    out = {}
    for name, value in hf_state.items():
        if name == "final_logits_bias":
            assert not value.any(), "seqtrain's BART has no output bias"
            continue
        if name in ("model.shared.weight", "lm_head.weight"):
            continue  # the same tensor as the embed_tokens below
        out[name.removeprefix("model.")] = value
    out["decoder.output_projection.weight"] = hf_state["lm_head.weight"]
    return out


def build_pair(vocab, dim, layers, heads, ffn, max_pos=64, seed=0, prenorm=False):
    """prenorm: seqtrain's --encoder/--decoder-normalize-before against HF's MBart (the same network as BART
    with pre-norm layers and a final layer norm after each stack)."""
    torch.manual_seed(seed)
    hf_config_cls = transformers.MBartConfig if prenorm else transformers.BartConfig
    hf_model_cls = (
        transformers.MBartForConditionalGeneration if prenorm else transformers.BartForConditionalGeneration
    )
    hf_cfg = hf_config_cls(
        vocab_size=vocab,
        d_model=dim,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=max_pos,
        scale_embedding=False,
        activation_function="gelu",
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
        attn_implementation="eager",  # a different attention code path from ours
    )
    hf = hf_model_cls(hf_cfg).eval()
    with (
        torch.no_grad()
    ):  # HF zero-inits biases and unit-inits LayerNorms: perturb so misplaced ones would show
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    cfg = BartConfig(
        vocab_size=vocab,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_embed_dim=dim,
        decoder_embed_dim=dim,
        encoder_ffn_embed_dim=ffn,
        decoder_ffn_embed_dim=ffn,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        max_source_positions=max_pos,
        max_target_positions=max_pos,
        encoder_normalize_before=prenorm,
        decoder_normalize_before=prenorm,
    )
    with torch.device("meta"):  # skip our own random init: every value is overwritten below
        ours = BARTModel(cfg, padding_idx=PAD)
    ours.to_empty(device="cpu").eval()
    ours.tie_weights()  # to_empty() unties the output projection
    ours.load_state_dict(hf_to_seqtrain(hf.state_dict()), strict=True)
    assert (
        ours.decoder.output_projection.weight
        is ours.encoder.embed_tokens.weight
        is ours.decoder.embed_tokens.weight
    )
    return hf, ours


def padded(lengths, vocab, seed, first=None, last=None):
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        if first is not None:
            out[i, 0] = first
        if last is not None:
            out[i, n - 1] = last
    return out


def check(hf, ours, vocab, src_lengths, tgt_lengths):
    src = padded(src_lengths, vocab, seed=1, last=EOS)  # right-padded, as HF expects
    prev = padded(tgt_lengths, vocab, seed=2, first=EOS)
    real = prev.ne(PAD)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=src.ne(PAD).long(), decoder_input_ids=prev).logits
        full, _ = ours(src, None, prev)
        assert full.shape == ref.shape
        torch.testing.assert_close(full[real], ref[real], **FP32)

        enc = ours.encoder(src, None)
        state = {}
        steps = torch.cat(
            [ours.decoder(prev[:, :t], enc, incremental_state=state)[0] for t in range(1, prev.size(1) + 1)],
            dim=1,
        )
        torch.testing.assert_close(steps[real], ref[real], **FP32)
    return ref


@pytest.mark.slow
def test_parity_tiny():
    hf, ours = build_pair(vocab=64, dim=32, layers=2, heads=4, ffn=48)
    ref = check(hf, ours, 64, src_lengths=[9, 5, 2, 9], tgt_lengths=[4, 7, 1, 6])
    assert ref.abs().max() > 0.1  # logits are not trivially small


@pytest.mark.slow
def test_parity_bart_base_shapes():
    # bart-base: d 768, 6+6 layers, 12 heads, ffn 3072; a small vocabulary keeps it quick.
    hf, ours = build_pair(vocab=1000, dim=768, layers=6, heads=12, ffn=3072)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    check(hf, ours, 1000, src_lengths=[12, 7, 3], tgt_lengths=[5, 3, 2])


@pytest.mark.slow
def test_parity_prenorm_against_mbart():
    """--encoder-normalize-before / --decoder-normalize-before: the padded (packed) forward and incremental
    decoding both match transformers' MBartForConditionalGeneration on the same weights."""
    hf, ours = build_pair(vocab=64, dim=32, layers=2, heads=4, ffn=48, prenorm=True)
    assert ours.encoder.layer_norm is not None and ours.decoder.layer_norm is not None
    assert set(ours.state_dict()) >= {"encoder.layer_norm.weight", "decoder.layer_norm.bias"}
    ref = check(hf, ours, 64, src_lengths=[9, 5, 2, 9], tgt_lengths=[4, 7, 1, 6])
    assert ref.abs().max() > 0.1
    # training mode without dropout takes the same packed path and gives the same logits
    ours.train()
    for m in ours.modules():
        if hasattr(m, "dropout") and isinstance(m.dropout, float):
            m.dropout = 0.0
    src = padded([9, 5, 2, 9], 64, seed=1, last=EOS)
    prev = padded([4, 7, 1, 6], 64, seed=2, first=EOS)
    real = prev.ne(PAD)
    torch.testing.assert_close(ours(src, None, prev)[0][real], ref[real], **FP32)
