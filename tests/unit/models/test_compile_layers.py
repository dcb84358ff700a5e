"""--compile: each encoder/decoder layer's packed forward is one compiled region with no graph break, shared by
the layers of a stack, compiled once for batches of any size and max lengths; outputs and gradients equal eager's.
The CPU's attention operator takes the max lengths as the GPU's kernel does (seqtrain.models.varlen), so a graph
that would recompile on a new max length on the GPU recompiles here too."""

from __future__ import annotations

import random

import pytest
import torch
from torch._dynamo.utils import counters

from seqtrain.models import transformer
from seqtrain.models.transformer import compile_layers
from tests.unit.models.test_packed import loss_and_grads, model_of, sample_of
from tests.utils import FP32


def varied_batches(n: int = 20, seed: int = 0) -> list[dict]:
    """`n` collated batches of 2-9 pairs, sources 1-200 and targets 1-100 tokens: several max-length buckets."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        rows = r.randint(2, 9)
        out.append(sample_of([(r.randint(1, 200), r.randint(1, 100)) for _ in range(rows)], seed=i))
    return out


def three_shapes() -> list[dict]:
    """Three batches that differ in every shape a compiled layer sees: rows, tokens and both sides' max lengths
    (source buckets 64, 192, 256; target 64, 128, 192)."""
    lengths = [
        [(40, 20), (13, 60), (7, 3)],
        [(150, 90), (5, 9), (70, 30), (1, 1), (33, 120)],
        [(230, 180), (99, 60)],
    ]
    return [sample_of(pairs, seed=i) for i, pairs in enumerate(lengths)]


def fresh_model() -> torch.nn.Module:
    return model_of(torch.float32, max_source_positions=256, max_target_positions=256)


@pytest.fixture
def clean_dynamo():
    torch._dynamo.reset()
    transformer._compiled.cache_clear()
    counters.clear()
    yield
    torch._dynamo.reset()
    transformer._compiled.cache_clear()


@pytest.mark.slow  # (20 batches through dynamo: about a minute on 2 busy cores)
def test_one_region_per_layer_no_graph_break_and_no_recompile_over_20_batches(clean_dynamo, monkeypatch):
    model = fresh_model()
    assert compile_layers(model, backend="aot_eager") == 4
    calls = []
    real = transformer._DynamicTokens.__call__
    monkeypatch.setattr(
        transformer._DynamicTokens, "__call__", lambda self, *a: calls.append(1) or real(self, *a)
    )
    batches = varied_batches()
    assert len({b["net_input"]["layout"]["src_max_len"] for b in batches}) >= 3  # several buckets
    for sample in batches:
        loss_and_grads(model, sample)
    assert len(calls) == 4 * len(batches)  # every layer ran as its compiled region, every batch
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    # one graph per layer class (the two encoder layers share one, the two decoder layers the other), each
    # compiled once: frames that dynamo compiled, recompiles included (a max length held as a host int was
    # guarded on and recompiled both classes at its first change: 2 more frames on the H200, 2026-12-04)
    assert counters["stats"]["unique_graphs"] == 2
    assert counters["frames"]["ok"] == 2, dict(counters["frames"])


@pytest.mark.slow
def test_inductor_layers_equal_eager_and_new_batch_shapes_compile_nothing(clean_dynamo):
    eager, compiled = fresh_model(), fresh_model()
    compile_layers(compiled)  # inductor, as --compile
    batches = three_shapes()
    for key in ("src_max_len", "tgt_max_len", "src_cu_seqlens", "src_tokens", "tgt_tokens"):
        sizes = [b["net_input"]["layout"][key] for b in batches]
        assert len({n if isinstance(n, int) else n.numel() for n in sizes}) == 3, key  # all three differ
    frames = []
    for sample in batches:
        feats_e = eager(**sample["net_input"], features_only=True)[0]
        feats_c = compiled(**sample["net_input"], features_only=True)[0]
        torch.testing.assert_close(feats_c, feats_e, **FP32)
        loss_e, grads_e = loss_and_grads(eager, sample)
        loss_c, grads_c = loss_and_grads(compiled, sample)
        torch.testing.assert_close(loss_c, loss_e, **FP32)
        for name, g in grads_e.items():
            # 1e-6 of each gradient's largest entry: the loss is a sum over ~2,000 tokens (1,837 for the first
            # batch), so the embeddings' gradients are sums of thousands of terms whose fp32 rounding differs
            # between inductor's fused kernels and eager by ~2e-6 on entries of ~10 (2.4e-7 relative, measured)
            # (and 1e-6 absolute for gradients that are zero in exact arithmetic, e.g. the key projections' bias,
            # which softmax ignores: ~1e-13 of rounding)
            diff = (grads_c[name] - g).abs().max().item()
            assert diff <= 1e-6 * max(1.0, g.abs().max().item()), (name, diff)
        frames.append(counters["frames"]["ok"])
    # the first batch compiled one frame per layer class; the second and third, of other rows, tokens and max
    # lengths, reused them (forward and backward)
    assert frames == [2, 2, 2], frames
    assert counters["stats"]["unique_graphs"] == 2
    assert sum(counters["graph_break"].values()) == 0


def test_generation_and_padded_paths_stay_eager(clean_dynamo):
    model = fresh_model().eval()
    compile_layers(model, backend="aot_eager")
    net = {k: v for k, v in sample_of().items() if k == "net_input"}["net_input"]
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], None)
        state: dict = {}
        model.decoder(net["prev_output_tokens"][:, :1], enc, incremental_state=state)
    assert counters["frames"]["total"] == 0  # nothing was compiled
