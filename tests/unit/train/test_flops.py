"""The FLOP count behind the logged mfu: by hand for a tiny config, and against torch's FlopCounterMode on a
real forward + backward of a tiny BART."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from seqtrain.criterions import LabelSmoothedCrossEntropyCriterion
from seqtrain.models.bart import BartConfig, BARTModel
from seqtrain.train.flops import PEAK_FLOPS, Seq2SeqFlops, device_peak_flops, peak_flops, run_precision

PAD = 1


def test_hand_count_of_a_tiny_config():
    """1 encoder and 1 decoder layer, d = 4, f = 8, V = 10; one pair with S = 3, T = 2."""
    fl = Seq2SeqFlops(1, 1, 4, 4, 8, 8, 10)
    enc = 8 * 3 * 16 + 4 * 9 * 4 + 4 * 3 * 4 * 8  # 384 + 144 + 384
    self_attn = 8 * 2 * 16 + 4 * 4 * 4  # 256 + 64
    cross = 4 * 2 * 16 + 4 * 3 * 16 + 4 * 6 * 4  # 128 + 192 + 96
    ffn = 4 * 2 * 4 * 8  # 256
    out = 2 * 2 * 4 * 10  # 160
    assert enc + self_attn + cross + ffn + out == 2064
    assert fl.forward_flops([3], [2]) == 2064
    assert fl.train_flops([3], [2]) == 3 * 2064
    # pairs add up; lengths may be tensors
    assert fl.forward_flops(torch.tensor([3, 5]), torch.tensor([2, 1])) == 2064 + fl.forward_flops([5], [1])


def test_summarization_counts_source_tokens():
    """bart_large at CNN/DM-like lengths (1,024 source, 80 target tokens): the old 6 x params x target tokens
    undercounts several times."""
    fl = Seq2SeqFlops(12, 12, 1024, 1024, 4096, 4096, 50_265)
    params = 406e6
    ratio = fl.train_flops([1024], [80]) / (6 * params * 80)
    assert 4 < ratio < 15


def _tiny_bart():
    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=97,
        encoder_layers=2,
        decoder_layers=1,
        encoder_embed_dim=32,
        decoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        decoder_ffn_embed_dim=48,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        dropout=0.0,
    )
    return BARTModel(cfg, padding_idx=PAD).train()


def test_matches_flop_counter_on_a_real_forward_and_backward():
    """No padding (the count is of non-padding tokens; torch counts what runs), the math attention kernel
    (torch's counter knows no CPU flash kernel)."""
    model = _tiny_bart()
    b, s, t = 3, 24, 9
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 97, (b, s), generator=g)
    src[:, -1] = 2
    target = torch.randint(4, 97, (b, t), generator=g)
    prev = torch.cat([torch.full((b, 1), 2), target[:, :-1]], dim=1)
    net_input = {"src_tokens": src, "src_lengths": torch.full((b,), s), "prev_output_tokens": prev}
    sample = {"net_input": net_input, "target": target, "ntokens": b * t, "nsentences": b}
    crit = LabelSmoothedCrossEntropyCriterion(PAD, label_smoothing=0.1)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss, _, _ = crit(model, sample)
        loss.backward()
    measured = counter.get_total_flops()
    expected = Seq2SeqFlops.from_model(model).sample_train_flops(sample, PAD)
    assert measured > 0
    assert expected == pytest.approx(measured, rel=1e-6)  # the same matrix products, counted the same way


def test_peak_table_by_device_name_and_precision():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H200", "tf32") == 494.7e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp16") == 312e12
    assert peak_flops("NVIDIA A100 80GB PCIe", "tf32") == 156e12
    assert peak_flops("NVIDIA GeForce RTX 4090", "bf16") is None
    assert set(PEAK_FLOPS["H200"]) == {"bf16", "fp16", "tf32", "fp32"}
    assert run_precision(torch.bfloat16) == "bf16" and run_precision(torch.float16) == "fp16"
    # --peak-flops wins; a CPU has no table entry
    assert device_peak_flops(torch.device("cpu"), None, override=2e11) == 2e11
    assert device_peak_flops(torch.device("cpu"), torch.bfloat16) is None
