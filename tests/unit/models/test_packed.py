"""Packed end to end against padded: the collater's layout changes where work runs, never the result.

The padded path (B x T, SDPA with masks) is the reference; the packed one runs every layer on the real tokens
and attends through seqtrain.models.varlen. Encoder output, decoder features (self- and cross-attention),
loss and every gradient agree to 1e-12 in fp64 and 1e-6 in fp32.
"""

from __future__ import annotations

import pytest
import torch

from seqtrain.criterions import LabelSmoothedCrossEntropyCriterion
from seqtrain.data.pair_dataset import LENGTH_BUCKET, batch_layout, collate_pairs
from seqtrain.models.bart import BartConfig, BARTModel

PAD, EOS, VOCAB = 1, 2, 60
LENGTHS = [(13, 7), (5, 9), (9, 1), (1, 4), (11, 11)]  # (source, target), ragged on both sides


def model_of(dtype: torch.dtype, **kw) -> BARTModel:
    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=VOCAB,
        encoder_layers=2,
        decoder_layers=2,
        encoder_embed_dim=32,
        decoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        decoder_ffn_embed_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        dropout=0.0,
        **{"max_source_positions": 64, "max_target_positions": 64, **kw},
    )
    return BARTModel(cfg).to(dtype).train()


def sample_of(lengths=LENGTHS, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    items = [
        {
            "id": i,
            "source": torch.cat([torch.randint(4, VOCAB, (s - 1,), generator=g), torch.tensor([EOS])]),
            "target": torch.cat([torch.randint(4, VOCAB, (t - 1,), generator=g), torch.tensor([EOS])]),
        }
        for i, (s, t) in enumerate(lengths)
    ]
    return collate_pairs(items, PAD, EOS)


def padded(sample: dict) -> dict:
    """The same batch without the collater's layout: the model runs padded."""
    net = {k: v for k, v in sample["net_input"].items() if k != "layout"}
    return {**sample, "net_input": net}


def loss_and_grads(model: BARTModel, sample: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss, _, _ = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)(model, sample)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_layout_holds_the_real_tokens_their_positions_and_segments():
    sample = sample_of()
    net = sample["net_input"]
    layout = net["layout"]
    src_keep = net["src_tokens"].ne(PAD)
    assert torch.equal(layout["src_tokens"], net["src_tokens"][src_keep])
    lengths = sorted((s for s, _ in LENGTHS), reverse=True)  # rows sorted by source length
    assert layout["src_cu_seqlens"].dtype == torch.int32
    assert layout["src_cu_seqlens"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert layout["src_max_len"] == LENGTH_BUCKET  # 13 rounded up
    # positions count from pad + 1 in every row, whatever side it is padded on
    assert layout["src_positions"][: lengths[0]].tolist() == list(range(PAD + 1, PAD + 1 + lengths[0]))
    tgt = net["prev_output_tokens"]
    assert torch.equal(layout["tgt_tokens"], tgt[tgt.ne(PAD)])
    # the decoder's packed rows are the target rows the loss scores, in the same order
    assert torch.equal(
        tgt.ne(PAD).reshape(-1).nonzero().squeeze(1),
        sample["target"].ne(PAD).reshape(-1).nonzero().squeeze(1),
    )
    assert batch_layout(net["src_tokens"][:, -3:], tgt[:, :2], PAD)["src_max_len"] == LENGTH_BUCKET


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)], ids=["fp64", "fp32"])
@pytest.mark.parametrize("prenorm", [False, True], ids=["postnorm", "prenorm"])
def test_packed_equals_padded_outputs_loss_and_gradients(dtype, tol, prenorm):
    model = model_of(dtype, encoder_normalize_before=prenorm, decoder_normalize_before=prenorm)
    sample = sample_of()
    net = sample["net_input"]
    # the encoder: packed rows are the padded output's real positions
    enc_packed = model.encoder(net["src_tokens"], None, net["layout"])["encoder_out"]
    enc_padded = model.encoder(net["src_tokens"], None)
    assert enc_packed.shape == (sum(s for s, _ in LENGTHS), 32)
    torch.testing.assert_close(
        enc_packed, enc_padded["encoder_out"][~enc_padded["encoder_padding_mask"]], rtol=tol, atol=tol
    )
    # the decoder (causal self-attention and cross-attention): packed rows are the target rows
    feats, extra = model(**net, features_only=True)
    ref, ref_extra = model(**padded(sample)["net_input"], features_only=True)
    assert extra["packed"] and "packed" not in ref_extra
    rows = sample["target_rows"]
    torch.testing.assert_close(feats, ref.reshape(-1, 32).index_select(0, rows), rtol=tol, atol=tol)
    # loss and every gradient
    loss, grads = loss_and_grads(model, sample)
    ref_loss, ref_grads = loss_and_grads(model, padded(sample))
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=0)
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=tol, atol=tol, msg=name)


def test_packed_batch_equals_its_examples_run_one_by_one():
    """A packed batch's loss and gradients are the sums of its examples' (fp64): nothing crosses sequences."""
    model = model_of(torch.float64)
    loss, grads = loss_and_grads(model, sample_of())
    # each example alone: the same tokens as in the batch, from the same generator draws
    g = torch.Generator().manual_seed(0)
    items = []
    for i, (s, t) in enumerate(LENGTHS):
        items.append(
            {
                "id": i,
                "source": torch.cat([torch.randint(4, VOCAB, (s - 1,), generator=g), torch.tensor([EOS])]),
                "target": torch.cat([torch.randint(4, VOCAB, (t - 1,), generator=g), torch.tensor([EOS])]),
            }
        )
    singles = [loss_and_grads(model, collate_pairs([it], PAD, EOS)) for it in items]
    assert loss.item() == pytest.approx(sum(s[0].item() for s in singles), rel=1e-12)
    for name, g in grads.items():
        torch.testing.assert_close(g, sum(s[1][name] for s in singles), rtol=1e-10, atol=1e-12, msg=name)


def test_ignore_prefix_size_scores_the_same_rows_packed_and_padded():
    model = model_of(torch.float64)
    sample = sample_of()
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1, ignore_prefix_size=2)
    packed_loss = crit(model, sample)[0]
    padded_loss = crit(model, padded(sample))[0]
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-12, atol=0)


def test_incremental_decoding_is_unchanged_by_the_packed_path():
    """Generation runs padded with the key/value cache: its last-step logits equal the full padded pass."""
    model = model_of(torch.float64).eval()
    net = padded(sample_of())["net_input"]
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], None)
        full = model.decoder(net["prev_output_tokens"][:, :3], enc)[0]
        state: dict = {}
        for t in range(1, 4):
            step = model.decoder(net["prev_output_tokens"][:, :t], enc, incremental_state=state)[0]
    real = net["prev_output_tokens"][:, :3].ne(PAD).all(1)  # rows whose first 3 inputs are real tokens
    assert real.sum() == 4
    torch.testing.assert_close(step[real, 0], full[real, -1], rtol=1e-12, atol=1e-12)
