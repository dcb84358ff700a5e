"""LoRA adapters (seqtrain.models.lora): a fresh adapter computes the pretrained model exactly, every path of the
model (plain, packed, fused q/k/v, the feed-forward block, decoding with the cache) sees the adapter, and the
merged model computes what the adapted one does."""

from __future__ import annotations

import argparse

import pytest
import torch

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain.models.freeze import freeze
from seqtrain.models.lora import LoRALinear, merge_lora, parse_targets
from seqtrain.models.resize import fill_adapters


def make_dict() -> Dictionary:
    d = Dictionary()
    for i in range(24):
        d.add_symbol(f"w{i}")
    return d


def build(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(
        model_config(argparse.Namespace(arch="bart_tiny", dropout=0.0, **kw)), make_dict(), make_dict()
    ).eval()


def batch():
    src = torch.tensor([[1, 1, 5, 6, 7, 2], [8, 9, 10, 11, 12, 2]])  # left-padded, as the collater makes them
    prev = torch.tensor([[2, 13, 14, 1], [2, 15, 16, 17]])
    return src, torch.tensor([4, 6]), prev


def test_adapters_start_at_zero_and_only_they_train():
    base = build()
    lora = build(seed=5, lora_rank=4, lora_modules="q_proj,v_proj,fc1")
    state = fill_adapters(base.state_dict(), lora, "base.pt")
    lora.load_state_dict(state, strict=True)
    n = sum(isinstance(m, LoRALinear) for m in lora.modules())
    assert n == 2 * 2 + 2 * 2 * 2 + 2 * 2  # q,v in self-attention (4 layers) and cross-attention (2), fc1 (4)
    src, lengths, prev = batch()
    with torch.no_grad():
        assert torch.equal(lora(src, lengths, prev)[0], base(src, lengths, prev)[0])  # B = 0: the base model
    freeze(lora, lora=True)
    trained = {k for k, p in lora.named_parameters() if p.requires_grad}
    assert trained and all(k.endswith((".lora_A", ".lora_B")) for k in trained)
    assert "encoder.layers.0.self_attn.q_proj.weight" in dict(lora.named_parameters())  # fairseq's names kept


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_every_path_sees_the_adapter_and_the_merged_model_computes_the_same(packed):
    lora = build(lora_rank=2, lora_alpha=4.0, lora_modules="q_proj,k_proj,v_proj,out_proj,fc1,fc2")
    with torch.no_grad():
        for m in lora.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.5)  # a trained adapter
    src, lengths, prev = batch()
    from seqtrain.data.pair_dataset import batch_layout

    layout = batch_layout(src, prev, 1) if packed else None
    merged = build(lora_rank=2, lora_alpha=4.0, lora_modules="q_proj,k_proj,v_proj,out_proj,fc1,fc2")
    merged.load_state_dict(lora.state_dict())
    assert merge_lora(merged) == 2 * 6 + 2 * 6 + 2 * 4  # enc self 6 each, dec self 4 + cross 4 + ffn 2
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    with torch.no_grad():
        want = merged(src, lengths, prev, layout=layout)[0]
        got = lora(src, lengths, prev, layout=layout)[0]
        plain = build()(src, lengths, prev, layout=layout)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - plain).abs().max() > 1e-2  # the adapters change what the model computes
    # training mode takes the custom feed-forward and fused paths: the same values
    lora.train()
    out = lora(src, lengths, prev, layout=layout)[0]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    grads = [m.lora_A.grad for m in lora.modules() if isinstance(m, LoRALinear)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_bad_modules_are_one_line():
    with pytest.raises(SeqtrainError, match=r"^--lora-modules: embed: choose from q_proj,k_proj"):
        parse_targets("q_proj,embed")
    assert parse_targets(None) == ("q_proj", "v_proj")
