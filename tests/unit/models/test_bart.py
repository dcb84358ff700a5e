"""BART model: fairseq parity, parameter names, incremental decoding, beam folding, reordering, presets, flags."""

import argparse

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import BartConfig, BARTModel, add_args, build_model
from seqtrain.registry import ARCHS
from tests.utils import FP32

PAD, EOS = 1, 2


def tiny(**kw):
    base = dict(
        vocab_size=50,
        encoder_layers=2,
        decoder_layers=2,
        encoder_embed_dim=32,
        decoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        decoder_ffn_embed_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        max_source_positions=64,
        max_target_positions=64,
    )
    base.update(kw)
    return BartConfig(**base)


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    m = BARTModel(tiny(**kw))
    # Non-trivial LayerNorms and biases, so a misplaced one would show.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def left_padded(lengths, vocab=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        out[i, max(lengths) - n :] = torch.randint(4, vocab, (n,), generator=g)
        out[i, -1] = EOS
    return out


def right_padded(lengths, vocab=50, seed=2):
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        out[i, 0] = EOS
    return out


class Args(argparse.Namespace):
    pass


class Dict_:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def pad(self):
        return PAD


# ---------------------------------------------------------------- fairseq parity (files written by fairseq 0.12)


def _fairseq_model(fairseq_tiny):
    torch.serialization.add_safe_globals([argparse.Namespace])
    ck = torch.load(fairseq_tiny / "checkpoint_last.pt", weights_only=True)
    args = ck["cfg"]["model"]
    model = BARTModel(
        from_args(BartConfig, args, vocab_size=ck["model"]["encoder.embed_tokens.weight"].shape[0])
    )
    state = {k: v for k, v in ck["model"].items() if not k.endswith(".version")}
    assert list(model.state_dict()) == list(state)  # same names, same order
    model.load_state_dict(state, strict=True)
    ref = torch.load(fairseq_tiny / "reference_forward.pt", weights_only=True)
    return model.eval(), ref


def test_matches_fairseq_reference_forward(fairseq_tiny):
    model, ref = _fairseq_model(fairseq_tiny)
    assert len(ref) == 5 and ref[4]["src_tokens"].eq(PAD).any()  # the batch entry is left-padded
    with torch.no_grad():
        for entry in ref:
            logits, _ = model(entry["src_tokens"], entry["src_lengths"], entry["prev_output_tokens"])
            assert logits.shape == entry["logits"].shape
            torch.testing.assert_close(logits, entry["logits"], **FP32)


def test_incremental_matches_fairseq_reference(fairseq_tiny):
    model, ref = _fairseq_model(fairseq_tiny)
    entry = ref[4]
    with torch.no_grad():
        enc = model.encoder(entry["src_tokens"], entry["src_lengths"])
        state = {}
        prev = entry["prev_output_tokens"]
        for t in range(1, prev.size(1) + 1):
            step, _ = model.decoder(prev[:, :t], enc, incremental_state=state)
            assert step.shape == (prev.size(0), 1, entry["logits"].size(-1))
            torch.testing.assert_close(step[:, 0], entry["logits"][:, t - 1], **FP32)


# ---------------------------------------------------------------- names, init


def test_parameter_names_are_fairseqs():
    m = BARTModel(tiny(encoder_layers=1, decoder_layers=1))
    lin = lambda p: {f"{p}.weight", f"{p}.bias"}  # noqa: E731
    attn = lambda p: set().union(*(lin(f"{p}.{x}_proj") for x in "kvq"), lin(f"{p}.out_proj"))  # noqa: E731
    expected = {
        "encoder.embed_tokens.weight",
        "encoder.embed_positions.weight",
        "decoder.embed_tokens.weight",
        "decoder.embed_positions.weight",
        "decoder.output_projection.weight",
    }
    expected |= lin("encoder.layernorm_embedding") | lin("decoder.layernorm_embedding")
    for side in ("encoder", "decoder"):
        L = f"{side}.layers.0"
        expected |= (
            attn(f"{L}.self_attn") | lin(f"{L}.self_attn_layer_norm") | lin(f"{L}.fc1") | lin(f"{L}.fc2")
        )
        expected |= lin(f"{L}.final_layer_norm")
    expected |= attn("decoder.layers.0.encoder_attn") | lin("decoder.layers.0.encoder_attn_layer_norm")
    assert set(m.state_dict()) == expected
    assert len(expected) == 5 + 4 + 2 * (8 + 2 + 4 + 2) + 8 + 2
    # one shared tensor behind the three embedding names
    sd = m.state_dict()
    ptr = sd["encoder.embed_tokens.weight"].data_ptr()
    assert (
        sd["decoder.embed_tokens.weight"].data_ptr()
        == ptr
        == sd["decoder.output_projection.weight"].data_ptr()
    )
    assert m.encoder.embed_positions.weight.shape == (64 + PAD + 1, 32)


def test_init_like_fairseq_bart():
    torch.manual_seed(0)
    m = BARTModel(
        tiny(
            encoder_embed_dim=64,
            decoder_embed_dim=64,
            encoder_ffn_embed_dim=256,
            decoder_ffn_embed_dim=256,
            vocab_size=400,
        )
    )
    w = m.encoder.layers[0].fc1.weight
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert m.encoder.embed_tokens.weight[PAD].abs().sum() == 0
    assert m.decoder.embed_positions.weight[PAD].abs().sum() == 0
    assert m.encoder.embed_positions.weight[PAD + 1].abs().sum() > 0
    assert m.decoder.layers[0].encoder_attn.q_proj.bias.abs().sum() == 0
    assert torch.equal(m.decoder.layers[0].final_layer_norm.weight, torch.ones(64))


# ---------------------------------------------------------------- forward behaviour


def test_left_padded_row_equals_unpadded_row():
    m = make_model()
    src = left_padded([9, 4, 6])
    prev = right_padded([5, 5, 5])
    with torch.no_grad():
        batch, _ = m(src, None, prev)
        for i, n in enumerate([9, 4, 6]):
            single, _ = m(src[i : i + 1, -n:], None, prev[i : i + 1])
            torch.testing.assert_close(batch[i : i + 1], single, **FP32)


def test_right_padded_decoder_rows_and_no_nan_at_pads():
    m = make_model()
    src = left_padded([7, 7])
    prev = right_padded([6, 3])
    with torch.no_grad():
        logits, extra = m(src, None, prev)
        short, _ = m(src[1:], None, prev[1:, :3])
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[1:, :3], short, **FP32)
    assert len(extra["inner_states"]) == 3


def test_features_only_and_output_layer_on_selected_rows():
    m = make_model()
    src, prev = left_padded([8, 5]), right_padded([6, 2])
    with torch.no_grad():
        logits, _ = m(src, None, prev)
        x, _ = m(src, None, prev, features_only=True)
        keep = prev.ne(PAD)
        sel = m.output_layer(x[keep])
    assert x.shape == (2, 6, 32) and sel.shape == (8, 50)
    torch.testing.assert_close(sel, logits[keep], **FP32)
    lp = m.get_normalized_probs((logits, None), log_probs=True)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2, 6))


def _steps(model, enc, prev, state, start, stop):
    out = []
    for t in range(start, stop + 1):
        out.append(model.decoder(prev[:, :t], enc, incremental_state=state)[0])
    return torch.cat(out, dim=1)


def test_incremental_equals_full_forward():
    m = make_model()
    src, prev = left_padded([8, 3, 5]), right_padded([6, 6, 6])
    with torch.no_grad():
        full, _ = m(src, None, prev)
        enc = m.encoder(src, None)
        state = {}
        inc = _steps(m, enc, prev, state, 1, 6)
    torch.testing.assert_close(inc, full, **FP32)
    # keys and values of the 6 decoded positions, time-major: T x B x 2 x H x d
    assert state["layers.0.self_attn"]["kv"].shape == (6, 3, 2, 4, 8)
    with pytest.raises(ValueError, match="holds 6 steps"):
        m.decoder(prev[:, :3], enc, incremental_state=state)


def test_decoding_cache_grows_past_its_capacity_and_reorders_between_steps():
    """The self-attention cache starts with room for 16 positions and doubles; 40 steps with a random beam
    reorder every few steps (rows repeated and dropped, as beam search does) still give the full forward's
    output on the reordered prefixes."""
    m = make_model()
    src = left_padded([8, 3, 5, 6])
    g = torch.Generator().manual_seed(7)
    prev = torch.randint(4, 50, (4, 40), generator=g)
    prev[:, 0] = EOS
    with torch.no_grad():
        enc = m.encoder(src, None)
        state, buffers = {}, set()
        for t in range(1, 41):
            if t % 7 == 0:  # rows (one per sentence here) follow a random order, some repeated, some dropped
                order = torch.randint(0, 4, (4,), generator=g)
                m.decoder.reorder_incremental_state(state, order, encoder_order=order)
                prev = torch.cat([prev[order, : t - 1], prev[:, t - 1 :]], dim=1)
                src, enc = src[order], m.encoder(src[order], None)  # the reference's sources follow the rows
            out = m.decoder(prev[:, :t], enc, incremental_state=state)[0]
            buffers.add(state["layers.0.self_attn"]["kv_buf"].numel())
            full, _ = m(src, None, prev[:, :t])
            torch.testing.assert_close(out[:, -1], full[:, -1], **FP32)
    assert state["layers.0.self_attn"]["kv"].shape == (40, 4, 2, 4, 8)
    assert len(buffers) >= 3  # grown twice: 16 -> 32 -> 64 positions


class DispatchLog(TorchDispatchMode):
    """Records the aten operators dispatched inside it, each with the shape of its first argument."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[object, tuple[int, ...] | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.calls.append((func.overloadpacket, None if first is None else tuple(first.shape)))
        return func(*args, **(kwargs or {}))

    def casts_of(self, shapes: set | None) -> int:
        """dtype casts (aten._to_copy, aten.to) of tensors with one of `shapes` (None: of any tensor)."""
        kinds = (torch.ops.aten._to_copy, torch.ops.aten.to)
        return sum(op in kinds and (shapes is None or shape in shapes) for op, shape in self.calls)


def test_decoding_under_autocast_casts_the_fused_qkv_weight_once():
    """Autocast caches its casts of parameters, not of the decoding cache's fused q/k/v weight: the cache keeps
    that weight in autocast's dtype, so no decoding step after the first casts a weight again, and the logits
    still match the full forward under the same autocast."""
    m = make_model().eval()
    weight_shapes = {tuple(p.shape) for p in m.parameters()} | {(3 * 32, 32), (3 * 32,)}

    src, prev = left_padded([8, 3, 5]), right_padded([6, 6, 6])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = m(src, None, prev)
        enc = m.encoder(src, None)
        state = {}
        first = _steps(m, enc, prev, state, 1, 1)
        with DispatchLog() as log:
            rest = _steps(m, enc, prev, state, 2, 6)
    assert log.casts_of(weight_shapes) == 0
    assert state["layers.0.self_attn"]["qkv_weight"].dtype == torch.bfloat16
    assert state["layers.0.self_attn"]["kv"].dtype == torch.bfloat16
    torch.testing.assert_close(torch.cat([first, rest], 1).float(), full.float(), atol=0.05, rtol=0.05)


def test_beam_folded_incremental_reorder_and_drop():
    m = make_model()
    beam, bsz, T = 3, 3, 7
    src = left_padded([8, 3, 5])
    g = torch.Generator().manual_seed(5)
    prev = torch.randint(4, 50, (bsz * beam, T), generator=g)
    prev[:, 0] = EOS
    with torch.no_grad():
        enc = m.encoder(src, None)
        state = {}
        k = 3
        inc = _steps(m, enc, prev, state, 1, k)
        full, _ = m(src.repeat_interleave(beam, 0), None, prev)  # reference: encoder repeated per beam
        torch.testing.assert_close(inc, full[:, :k], **FP32)
        # keys/values of the encoder are kept once per sentence, not per beam
        assert state["layers.1.encoder_attn"]["k"].shape[0] == bsz
        assert state["layers.1.self_attn"]["kv"].shape[1] == bsz * beam

        # beam reorder: each sentence's rows pick random rows of the same sentence (repeats allowed)
        pick = torch.randint(0, beam, (bsz, beam), generator=g)
        new_order = (torch.arange(bsz)[:, None] * beam + pick).view(-1)
        m.decoder.reorder_incremental_state(state, new_order)
        prev2 = torch.cat([prev[new_order, :k], prev[:, k:]], dim=1)  # new continuations after the reorder
        inc2 = _steps(m, enc, prev2, state, k + 1, k + 2)
        full2, _ = m(src.repeat_interleave(beam, 0), None, prev2)
        torch.testing.assert_close(inc2, full2[:, k : k + 2], **FP32)

        # sentence 1 finishes: keep sentences 2 and 0, in that order
        encoder_order = torch.tensor([2, 0])
        new_order = (encoder_order[:, None] * beam + torch.arange(beam)).view(-1)
        m.decoder.reorder_incremental_state(state, new_order, encoder_order=encoder_order)
        enc3 = m.encoder.reorder_encoder_out(enc, encoder_order)
        prev3 = prev2[new_order]
        inc3 = _steps(m, enc3, prev3, state, k + 3, T)
        full3, _ = m(src[encoder_order].repeat_interleave(beam, 0), None, prev3)
        torch.testing.assert_close(inc3, full3[:, k + 2 :], **FP32)
        assert state["layers.0.encoder_attn"]["k"].shape[0] == 2
        assert torch.equal(enc3["encoder_padding_mask"], src[encoder_order].eq(PAD))


def test_full_forward_with_beam_folded_batch():
    m = make_model()
    src, beam = left_padded([6, 2]), 2
    prev = right_padded([4, 4, 3, 4])
    with torch.no_grad():
        enc = m.encoder(src, None)
        folded, _ = m.decoder(prev, enc)
        full, _ = m(src.repeat_interleave(beam, 0), None, prev)
    torch.testing.assert_close(folded, full, **FP32)


def test_checkpoint_activations_same_gradients(monkeypatch):
    import seqtrain.models.bart as bart

    calls = []
    real = bart.checkpoint
    monkeypatch.setattr(bart, "checkpoint", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    src, prev = left_padded([7, 4]), right_padded([5, 3])
    grads = []
    for ckpt in (False, True):
        m = make_model(
            dropout=0.2, attention_dropout=0.1, activation_dropout=0.1, checkpoint_activations=ckpt
        )
        m.train()
        torch.manual_seed(3)
        logits, _ = m(src, None, prev)
        logits.logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-6, rtol=1e-5, msg=n)
    assert grads[0]["encoder.layers.0.fc1.weight"].abs().sum() > 0
    assert calls == [{"use_reentrant": False}] * 4  # 2 encoder + 2 decoder layers, only in the second run


def test_dropout_active_only_in_training():
    m = make_model(dropout=0.3)
    src, prev = left_padded([5]), right_padded([4])
    with torch.no_grad():
        a, b = m(src, None, prev)[0], m(src, None, prev)[0]
        m.train()
        c = m(src, None, prev)[0]
    assert torch.equal(a, b) and not torch.allclose(a, c)


# ---------------------------------------------------------------- presets, flags, errors


def _parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--max-source-positions", type=int, default=1024)  # as a task would add it first
    add_args(p)
    return p.parse_args(argv)


@pytest.mark.parametrize(
    "arch,layers,dim,ffn,heads",
    [
        ("bart_tiny", 2, 64, 128, 4),
        ("bart_small", 3, 256, 1024, 4),
        ("bart_base", 6, 768, 3072, 12),
        ("bart_large", 12, 1024, 4096, 16),
    ],
)
def test_presets_fill_fairseq_defaults(arch, layers, dim, ffn, heads):
    args = _parse([])
    ARCHS.get(arch)(args)
    assert (args.encoder_layers, args.decoder_layers) == (layers, layers)
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (dim, dim)
    assert (args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim) == (ffn, ffn)
    assert (args.encoder_attention_heads, args.decoder_attention_heads) == (heads, heads)
    assert (args.dropout, args.attention_dropout, args.activation_dropout) == (0.1, 0.0, 0.0)
    assert args.activation_fn == "gelu" and args.share_all_embeddings is True
    assert (args.max_source_positions, args.max_target_positions) == (1024, 1024)
    assert args.checkpoint_activations is False


def test_override_flags_win_and_shapes_follow():
    args = _parse(
        [
            "--encoder-layers",
            "3",
            "--decoder-layers",
            "1",
            "--encoder-embed-dim",
            "48",
            "--decoder-embed-dim",
            "48",
            "--encoder-ffn-embed-dim",
            "96",
            "--decoder-attention-heads",
            "2",
            "--dropout",
            "0.25",
            "--max-target-positions",
            "40",
            "--activation-fn",
            "relu",
            "--checkpoint-activations",
        ]
    )
    args.arch = "bart_tiny"
    m = build_model(model_config(args), Dict_(24), Dict_(24))
    assert len(m.encoder.layers) == 3 and len(m.decoder.layers) == 1
    assert m.encoder.embed_tokens.weight.shape == (24, 48)
    assert m.encoder.layers[0].fc1.weight.shape == (96, 48)
    assert m.decoder.layers[0].fc1.weight.shape == (96, 48)  # decoder ffn follows the encoder's, as fairseq
    assert m.decoder.layers[0].self_attn.num_heads == 2 and m.encoder.layers[0].self_attn.num_heads == 4
    assert m.decoder.embed_positions.weight.shape == (40 + PAD + 1, 48)
    assert m.encoder.embed_positions.weight.shape == (1024 + PAD + 1, 48)
    assert m.max_positions() == (1024, 40)
    assert m.cfg.dropout == 0.25 and m.cfg.activation_fn == "relu" and m.cfg.checkpoint_activations
    assert m.encoder.layers[0].dropout == 0.25


def test_fairseq_finetuning_flags_are_accepted():
    # the flags fairseq's BART summarization fine-tuning command passes
    args = _parse(
        [
            "--layernorm-embedding",
            "--share-all-embeddings",
            "--share-decoder-input-output-embed",
            "--dropout",
            "0.1",
            "--attention-dropout",
            "0.1",
        ]
    )
    args.arch = "bart_tiny"
    m = build_model(model_config(args), Dict_(24), Dict_(24))
    assert m.cfg.attention_dropout == 0.1 and m.encoder.layers[0].self_attn.dropout == 0.1
    assert m.decoder.output_projection.weight is m.encoder.embed_tokens.weight


def test_unshared_embeddings_allow_two_dictionaries():
    args = _parse(["--no-share-all-embeddings"])
    args.arch = "bart_tiny"
    m = build_model(model_config(args), Dict_(30), Dict_(20))
    assert m.encoder.embed_tokens.weight.shape[0] == 30 and m.decoder.embed_tokens.weight.shape[0] == 20
    assert m.decoder.output_projection.weight is m.decoder.embed_tokens.weight
    assert m.decoder.embed_tokens.weight is not m.encoder.embed_tokens.weight
    with torch.no_grad():
        out, _ = m.eval()(left_padded([4], vocab=30), None, right_padded([3], vocab=20))
    assert out.shape == (1, 3, 20)


def test_user_errors_are_one_line_seqtrain_errors():
    args = _parse([])
    args.arch = "bart_tiny"
    with pytest.raises(SeqtrainError, match="joined dictionary: source has 30 symbols, target 20"):
        build_model(model_config(args), Dict_(30), Dict_(20))
    bad = _parse(["--encoder-attention-heads", "5"])
    bad.arch = "bart_tiny"
    with pytest.raises(
        SeqtrainError, match="--encoder-embed-dim 64 must be divisible by --encoder-attention-heads 5"
    ):
        build_model(model_config(bad), Dict_(30), Dict_(30))
    unknown = _parse([])
    unknown.arch = "bart_huge"
    with pytest.raises(SeqtrainError, match="--arch: unknown arch 'bart_huge'"):
        build_model(model_config(unknown), Dict_(30), Dict_(30))
    m = make_model()
    with pytest.raises(SeqtrainError, match="exceeds --max-source-positions 64"):
        m(torch.full((1, 65), 5), None, right_padded([2]))


@pytest.mark.cuda
def test_cuda_fp32_and_bf16_match_cpu():
    m = make_model()
    src, prev = left_padded([9, 4, 6]), right_padded([5, 5, 5])
    with torch.no_grad():
        ref, _ = m(src, None, prev)
        m = m.cuda()
        src, prev = src.cuda(), prev.cuda()
        out, _ = m(src, None, prev)
        torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=0)
        enc = m.encoder(src, None)
        state = {}
        inc = _steps(m, enc, prev, state, 1, prev.size(1))
        torch.testing.assert_close(inc.cpu(), ref, atol=1e-4, rtol=0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half, _ = m(src, None, prev)
        assert torch.isfinite(half).all()
        torch.testing.assert_close(half.float().cpu(), ref, atol=0.1, rtol=0)


@pytest.mark.parametrize("activation_fn", ["gelu", "relu", "gelu_accurate", "swish", "tanh", "relu_squared"])
def test_ffn_recomputing_activation_matches_plain_autograd(activation_fn):
    """The training FFN keeps fc1's output, not the activation's, and recomputes it in the backward pass: the
    output and every gradient equal plain autograd's (fp64), and it runs under bf16 autocast too."""
    from seqtrain.models.transformer import TransformerEncoderLayer

    torch.manual_seed(0)
    layer = TransformerEncoderLayer(16, 40, 2, dropout=0.0, activation_fn=activation_fn).double().train()
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 5, 16, dtype=torch.float64)
    out = layer._ffn(x)
    out.backward(g)
    got = [x.grad.clone()] + [
        p.grad.clone() for p in (layer.fc1.weight, layer.fc1.bias, layer.fc2.weight, layer.fc2.bias)
    ]
    assert out.grad_fn.name().endswith("_FFNBackward")
    layer.zero_grad()
    x.grad = None
    ref = layer.fc2(layer.activation(layer.fc1(x)))
    ref.backward(g)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    want = [x.grad] + [p.grad for p in (layer.fc1.weight, layer.fc1.bias, layer.fc2.weight, layer.fc2.bias)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    layer = layer.float()
    xf = x.detach().float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer._ffn(xf)
    assert out.dtype == torch.bfloat16
    out.float().backward(g.float())
    assert layer.fc1.weight.grad.dtype == torch.float32 and xf.grad.dtype == torch.float32
    torch.testing.assert_close(layer.fc1.weight.grad, want[1].float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(xf.grad, want[0].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("activation_fn", ["gelu", "relu", "gelu_accurate", "swish", "tanh"])
def test_ffn_direct_activation_derivative_equals_autograds_bit_for_bit(activation_fn, monkeypatch):
    """The FFN's backward pass calls the activation's derivative kernel directly (no nested autograd pass per
    layer); under bf16 autocast its gradients equal, bit for bit, those of the nested torch.autograd.grad that
    it replaces (the kernels autograd itself runs)."""
    from seqtrain.models import transformer
    from seqtrain.models.transformer import TransformerEncoderLayer

    torch.manual_seed(0)
    layer = TransformerEncoderLayer(16, 40, 2, dropout=0.0, activation_fn=activation_fn).train()
    x = torch.randn(3, 5, 16, requires_grad=True)
    g = torch.randn(3, 5, 16)
    assert (
        transformer.ACTIVATIONS[activation_fn] in transformer._ACTIVATION_GRADS
    )  # the direct path is tested
    grads = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(transformer, "_ACTIVATION_GRADS", {})
        layer.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer._ffn(x)
        out.float().backward(g)
        grads.append([x.grad.clone()] + [p.grad.clone() for p in layer.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("activation_fn", ["gelu", "relu"])
def test_ffn_under_autocast_equals_plain_autograd_bit_for_bit_and_casts_no_more(activation_fn):
    """Under bf16 autocast the training FFN casts x and its weights once, in the forward pass, and keeps the
    casts for the backward pass: its output and gradients (in the inputs' dtypes) equal plain autograd's bit
    for bit, with no more casts than plain autograd makes (the backward pass used to cast x, fc1's and fc2's
    weights again: three kernel launches a layer on a GPU)."""
    from seqtrain.models.transformer import TransformerEncoderLayer

    torch.manual_seed(0)
    layer = TransformerEncoderLayer(16, 40, 2, dropout=0.0, activation_fn=activation_fn).train()
    x = torch.randn(3, 5, 16, requires_grad=True)
    g = torch.randn(3, 5, 16)
    runs = {}
    for name, ffn in (("ffn", layer._ffn), ("plain", lambda x: layer.fc2(layer.activation(layer.fc1(x))))):
        layer.zero_grad()
        x.grad = None
        with DispatchLog() as log:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = ffn(x)
            out.float().backward(g)
        grads = [x.grad] + [
            p.grad for p in (layer.fc1.weight, layer.fc1.bias, layer.fc2.weight, layer.fc2.bias)
        ]
        runs[name] = (out, [t.clone() for t in grads], log.casts_of(None))
        if name == "ffn":
            assert out.grad_fn.name().endswith("_FFNBackward")
    (out, grads, casts), (ref, ref_grads, ref_casts) = runs["ffn"], runs["plain"]
    assert out.dtype == ref.dtype == torch.bfloat16 and torch.equal(out, ref)
    for a, b in zip(grads, ref_grads, strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert torch.equal(a, b)
    assert casts == ref_casts


def test_weight_init_xavier_and_bert():
    """--weight-init: bert is BART's N(0, 0.02) everywhere; xavier is fairseq's transformer init (xavier-uniform
    layers, q/k/v with gain 1/sqrt(2), zero biases, N(0, dim^-0.5) embeddings with a zero pad row), and the output
    projection stays tied."""
    import argparse
    import math

    from seqtrain.errors import SeqtrainError
    from seqtrain.models.bart import BartConfig, BARTModel

    cfg = dict(
        vocab_size=3000,
        encoder_layers=1,
        decoder_layers=1,
        encoder_embed_dim=128,
        decoder_embed_dim=128,
        encoder_ffn_embed_dim=512,
        decoder_ffn_embed_dim=512,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
    )
    torch.manual_seed(0)
    bert = BARTModel(BartConfig(**cfg))
    torch.manual_seed(0)
    xav = BARTModel(BartConfig(weight_init="xavier", **cfg))
    assert bert.encoder.layers[0].fc1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert bert.encoder.embed_tokens.weight.std().item() == pytest.approx(0.02, rel=0.05)
    fc1 = xav.encoder.layers[0].fc1.weight
    assert fc1.abs().max().item() <= math.sqrt(6 / (128 + 512)) + 1e-6
    assert fc1.std().item() == pytest.approx(math.sqrt(2 / (128 + 512)), rel=0.05)
    q = xav.decoder.layers[0].encoder_attn.q_proj.weight
    assert q.std().item() == pytest.approx(math.sqrt(2 / 256) / math.sqrt(2), rel=0.05)
    assert not xav.encoder.layers[0].fc1.bias.any()
    emb = xav.encoder.embed_tokens.weight
    assert emb.std().item() == pytest.approx(128**-0.5, rel=0.05) and not emb[1].any()
    assert xav.decoder.output_projection.weight is emb
    with pytest.raises(SeqtrainError, match="--weight-init 'normal'"):
        BARTModel(BartConfig(weight_init="normal", **cfg))
    parser = argparse.ArgumentParser()
    add_args(parser)
    ns = parser.parse_args(
        ["--weight-init", "xavier", "--encoder-normalize-before", "--decoder-normalize-before"]
    )
    assert ns.weight_init == "xavier" and ns.encoder_normalize_before and ns.decoder_normalize_before
