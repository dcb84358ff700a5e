"""The compiled CPU decoding step (seqtrain/generation/cpu_step.py, csrc/cpu_step.cpp) against the eager one.

(a) The candidate step in one pass (`beam_candidates`) against an fp64 reference written with torch's ops, and
    inside the generator against the two-step path (log_probs + candidates) at fp32: the same candidates, the
    scores to rounding; every mask (pad, unk penalty, min length, max length, n-gram blocking), temperature,
    step 0's single row per sentence.
(b) The C++ decoder step against the model's incremental decoder, layer for layer: post-norm and pre-norm,
    GELU, tanh-GELU and ReLU, through beam reorders and sentences leaving (the cache is never gathered: a row
    table follows the beams); the encoder pass on the real tokens against the model's.
(c) Whole searches: the compiled path gives the eager path's hypotheses (scores within 1e-5) over the
    generation flags, fp32 and int8, and follows parameters that change in place (training before a ROUGE
    validation); without a compiler the eager step runs and one line says so.
(d) The product backends: oneDNN's packed linear with its post-ops equals F.linear + activation + residual.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from seqtrain.generation import cpu_step
from seqtrain.generation.decode_step import DecodeStep
from seqtrain.generation.search import GenerationConfig
from seqtrain.generation.sequence_generator import SequenceGenerator, encode
from seqtrain.models.bart import BartConfig, BARTModel
from seqtrain.models.cpu_products import LinearSpec, gemm_backend, run_linear
from seqtrain.models.int8 import quantize_int8
from tests.unit.generation.test_sequence_generator import (
    EOS,
    PAD,
    UNK,
    Dict4,
    V,
    left_pad,
    peaked_init_,
    sources,
    tiny_model,
)
from tests.utils import FP32, REPO

pytestmark = pytest.mark.skipif(
    cpu_step.extension() is None,
    reason=f"the compiled CPU step cannot be built here: {cpu_step.unavailable_reason()}",
)


@pytest.fixture(params=["vector", "plain"])
def kernels(request):
    """The hand-vectorized kernels (an AVX-512 build's) and the plain loops every build has (an AVX2-only CPU
    runs those): both checked on this machine."""
    before = cpu_step.extension().set_vector_kernels(request.param == "vector")
    yield request.param
    cpu_step.extension().set_vector_kernels(before)


# ------------------------------------------------------------------ (a) the candidate step


def reference_candidates(logits, prev, k, temperature, unk_penalty, ban_eos, at_max, history, ngram):
    """The two-step path written plainly in the logits' dtype: log_softmax, masks, beam add, topk (rows per
    sentence: R / len(at_max))."""
    n = at_max.numel()
    per = logits.size(0) // n
    lp = torch.log_softmax(logits / temperature if temperature != 1 else logits, dim=-1)
    lp[:, PAD] = -math.inf
    lp[:, UNK] -= unk_penalty
    row_max = at_max.repeat_interleave(per)
    if ban_eos:
        lp[~row_max, EOS] = -math.inf
    only_eos = torch.full_like(lp, -math.inf)
    only_eos[:, EOS] = lp[:, EOS]
    lp = torch.where(row_max.unsqueeze(1), only_eos, lp)
    for r in range(lp.size(0)):
        h = history[r].tolist()
        t = len(h)
        if ngram == 1:
            lp[r, h[1:]] = -math.inf
        elif ngram > 1 and t >= ngram:
            last = h[t - ngram + 1 :]
            for i in range(t - ngram + 1):
                if h[i : i + ngram - 1] == last:
                    lp[r, h[i + ngram - 1]] = -math.inf
    if prev is not None:
        lp = lp + prev.unsqueeze(1)
    scores, index = lp.view(n, -1).topk(k, dim=1)
    return scores, index % V, index // V


CASES = {
    "plain": dict(),
    "step0": dict(step0=True),
    "ngram2_unkpen": dict(ngram=2, unk_penalty=-1.5),
    "ngram1_unkpen_pos": dict(ngram=1, unk_penalty=2.0),
    "ngram3_temperature": dict(ngram=3, temperature=0.7),
    "min_len": dict(ban_eos=True),
    "at_max": dict(at_max=(1, 3)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_beam_candidates_match_the_reference(case, dtype, kernels):
    c = CASES[case]
    n, beam, t = 5, 1 if c.get("step0") else 3, 9
    g = torch.Generator().manual_seed(sorted(CASES).index(case))
    logits = (torch.randn(n * beam, V, generator=g, dtype=torch.float64) * 3).to(dtype)
    prev = None if c.get("step0") else -torch.rand(n * beam, generator=g, dtype=torch.float64).to(dtype) * 5
    history = torch.randint(4, 8, (n * beam, t), generator=g)  # few symbols: repeated n-grams
    history[:, 0] = EOS
    at_max = torch.zeros(n, dtype=torch.bool)
    at_max[list(c.get("at_max", ()))] = True
    k = 2 * 3
    args = (c.get("temperature", 1.0), c.get("unk_penalty", 0.0), c.get("ban_eos", False), at_max, history)
    want = reference_candidates(logits, prev, k, *args, c.get("ngram", 0))
    temperature, unk_penalty, ban_eos = args[:3]
    got = cpu_step.beam_candidates(
        logits, prev, k, temperature, PAD, UNK, unk_penalty, EOS, ban_eos, at_max, history, c.get("ngram", 0)
    )
    finite = want[0] > -math.inf
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=tol)
    assert got[0].dtype == dtype
    assert torch.equal(got[1][finite], want[1][finite]) and torch.equal(got[2][finite], want[2][finite])


def test_beam_candidates_refuse_non_finite_logits():
    """A NaN or an infinite logit: no candidates (the generator takes the two-step path, which maps NaN to -inf)."""
    logits = torch.randn(4, V)
    logits[2, 5] = float("nan")
    history = torch.full((4, 1), EOS)
    assert (
        cpu_step.beam_candidates(
            logits, None, 4, 1.0, PAD, UNK, 0.0, EOS, False, torch.zeros(4, dtype=torch.bool), history, 0
        )
        is None
    )
    logits[2, 5] = float("inf")
    assert (
        cpu_step.beam_candidates(
            logits, None, 4, 1.0, PAD, UNK, 0.0, EOS, False, torch.zeros(4, dtype=torch.bool), history, 0
        )
        is None
    )


@pytest.mark.parametrize("step", [0, 1, 6])
def test_fused_candidates_are_the_two_step_paths(step):
    """Inside the generator's step body at fp32: the same candidates (rows, tokens, which end), scores to 1e-5."""
    beam, n = 4, 6
    settings = GenerationConfig(beam=beam, max_len_b=8, min_len=3, no_repeat_ngram_size=2, unkpen=-0.5)
    body = DecodeStep(settings, PAD, UNK, EOS, max_len=64)
    srcs = left_pad(sources(n, seed=step))
    beams = body.begin(srcs, None, EOS)
    g = torch.Generator().manual_seed(step)
    beams.tokens[:, 1 : step + 1] = torch.randint(4, 9, (n * beam, step), generator=g)
    beams.scores[:, :step] = -torch.rand(n * beam, step, generator=g).cumsum(1)
    unexpanded = step == 0
    logits = torch.randn(n if unexpanded else n * beam, 1, V, generator=g) * 3
    got = body.fused_candidates(step, logits[:, -1], beams, unexpanded)
    full = logits.repeat_interleave(beam, dim=0) if unexpanded else logits
    want = body.candidates(step, body.log_probs(step, full, beams), beams)
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=1e-5)
    for name in ("tokens", "rows", "eos"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


# ------------------------------------------------------------------ (b) the decoder step and the encoder pass


MODELS = {
    "post_gelu": dict(),
    "pre_gelu": dict(encoder_normalize_before=True, decoder_normalize_before=True),
    "post_relu": dict(activation_fn="relu"),
    "pre_gelu_accurate": dict(
        encoder_normalize_before=True, decoder_normalize_before=True, activation_fn="gelu_accurate"
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_decoder_step_matches_the_incremental_decoder(name):
    """Through beam reorders within sentences and two sentences leaving, every step's logits are the eager
    decoder's (fp32 tolerance)."""
    model = tiny_model(seed=1, **MODELS[name])
    beam, srcs = 3, left_pad(sources(5, seed=4))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        enc = model.encoder(srcs)
        packed = cpu_step.PackedModel.get(model)
        steps = cpu_step.CompiledSteps(packed, packed.native_decoder(), enc, 5, 5 * beam)
        state, eager_enc = {}, enc
        tokens = torch.full((5, 1), EOS)
        for step in range(9):
            want, _ = model.decoder(tokens, eager_enc, incremental_state=state)
            torch.testing.assert_close(steps.logits(tokens), want, **FP32)
            nxt = torch.randint(4, V, (tokens.size(0), 1), generator=g)
            tokens = torch.cat([tokens, nxt], dim=1)
            sents = tokens.size(0) // (1 if step == 0 else beam)
            if step == 0:
                order, keep = torch.arange(5).repeat_interleave(beam), None
            elif step == 4:  # sentences 1 and 3 leave
                keep = torch.tensor([0, 2, 4])
                order = (keep.repeat_interleave(beam) * beam) + torch.randint(
                    0, beam, (3 * beam,), generator=g
                )
            else:
                keep = None
                order = torch.arange(sents).repeat_interleave(beam) * beam
                order = order + torch.randint(0, beam, order.shape, generator=g)
            model.decoder.reorder_incremental_state(state, order, keep)
            if keep is not None:
                eager_enc = model.encoder.reorder_encoder_out(eager_enc, keep)
            steps.reorder(order, keep)
            tokens = tokens.index_select(0, order)
        assert steps.decoder.steps == 9 and steps.decoder.rows == 3 * beam


def test_decoder_step_with_64_wide_heads_over_many_steps(kernels):
    """Heads of 64 (bart_small's and bart_base's width, which the vector kernels take 16 keys at a time) over 40
    steps: the logits are the eager decoder's."""
    torch.manual_seed(9)
    model = BARTModel(
        BartConfig(
            vocab_size=V,
            encoder_layers=1,
            decoder_layers=2,
            encoder_embed_dim=128,
            decoder_embed_dim=128,
            encoder_ffn_embed_dim=256,
            decoder_ffn_embed_dim=256,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            max_source_positions=64,
            max_target_positions=64,
            dropout=0.0,
        ),
        padding_idx=PAD,
    ).eval()
    peaked_init_(model.named_parameters())
    beam, srcs = 2, left_pad(sources(3, seed=1, lo=20, hi=40))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        enc = model.encoder(srcs)
        packed = cpu_step.PackedModel.get(model)
        steps = cpu_step.CompiledSteps(packed, packed.native_decoder(), enc, 3 * beam, 3 * beam)
        state, tokens = {}, torch.full((3 * beam, 1), EOS)
        for _ in range(40):
            want, _ = model.decoder(tokens, enc, incremental_state=state)
            torch.testing.assert_close(steps.logits(tokens), want, **FP32)
            order = torch.arange(3).repeat_interleave(beam) * beam + torch.randint(
                0, beam, (3 * beam,), generator=g
            )
            model.decoder.reorder_incremental_state(state, order)
            steps.reorder(order, None)
            tokens = torch.cat(
                [tokens.index_select(0, order), torch.randint(4, V, (3 * beam, 1), generator=g)], 1
            )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_encoder_pass_matches_the_model(name):
    """The encoder on the real tokens with the prepared products: the model's output at every real position,
    zeros at the pads, the same pad mask (left and right padding)."""
    model = tiny_model(seed=2, **MODELS[name])
    seqs = sources(7, seed=3)
    packed = cpu_step.PackedModel.get(model)
    for srcs in (left_pad(seqs), torch.tensor([s + [PAD] * (10 - len(s)) for s in seqs])):
        with torch.no_grad():
            want = model.encoder(srcs)
            got = packed.encode(srcs)
        real = srcs.ne(PAD)
        assert torch.equal(got["encoder_padding_mask"], want["encoder_padding_mask"])
        torch.testing.assert_close(got["encoder_out"][real], want["encoder_out"][real], **FP32)
        assert not got["encoder_out"][~real].any()


# ------------------------------------------------------------------ (c) whole searches


SEARCHES = {
    "beam4": dict(beam_size=4, max_len_b=15, nbest=4),
    "beam1_temperature": dict(beam_size=1, max_len_b=10, temperature=0.7),
    "ngram2_unkpen": dict(beam_size=4, max_len_b=14, no_repeat_ngram_size=2, unk_penalty=-2.0, nbest=2),
    "minlen_lenpen2": dict(beam_size=5, max_len_b=12, len_penalty=2.0, min_len=6),
    "maxlen_a": dict(beam_size=3, max_len_a=1.5, max_len_b=1, nbest=3),
    "ngram3_lenpen05": dict(beam_size=5, max_len_b=12, no_repeat_ngram_size=3, len_penalty=0.5),
}


def assert_same_hypotheses(a, b, tol=1e-5):
    assert len(a) == len(b)
    for hyps_a, hyps_b in zip(a, b):
        assert [h["tokens"].tolist() for h in hyps_a] == [h["tokens"].tolist() for h in hyps_b]
        for x, y in zip(hyps_a, hyps_b):
            assert abs(float(x["score"]) - float(y["score"])) <= tol
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"], rtol=0, atol=tol)


@pytest.mark.parametrize("pre", [False, True])
@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_compiled_search_gives_the_eager_hypotheses(name, pre, kernels):
    kw = dict(encoder_normalize_before=pre, decoder_normalize_before=pre)
    model = tiny_model(seed=3, **kw)
    srcs = left_pad(sources(9, seed=sorted(SEARCHES).index(name)))
    eager = SequenceGenerator(model, Dict4(), cpu_step=False, **SEARCHES[name])
    compiled = SequenceGenerator(model, Dict4(), **SEARCHES[name])
    steps = compiled._decoder(encode(model, srcs, None, None), 9, cpu_step.for_model(model))
    assert isinstance(steps, cpu_step.CompiledSteps)
    assert_same_hypotheses(compiled.generate(srcs), eager.generate(srcs))


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_the_compiled_loop_is_the_python_loop_bit_for_bit(name, monkeypatch):
    """Plain beam search on the compiled step runs its whole loop in C++ (cpu_step.CompiledSteps.search); the
    Python loop over the same compiled decoder and fused candidate step (what runs when that search declines)
    gives the same hypotheses, scores and positional scores, bit for bit."""
    model = tiny_model(seed=8)
    srcs = left_pad(sources(11, seed=3 + sorted(SEARCHES).index(name)))
    calls = []
    search = cpu_step.CompiledSteps.search
    monkeypatch.setattr(cpu_step.CompiledSteps, "search", lambda *a: calls.append(1) or search(*a))
    in_cpp = SequenceGenerator(model, Dict4(), **SEARCHES[name]).generate(srcs)
    assert calls
    monkeypatch.setattr(cpu_step.CompiledSteps, "search", lambda *a: None)
    in_python = SequenceGenerator(model, Dict4(), **SEARCHES[name]).generate(srcs)
    assert len(in_cpp) == len(in_python)
    for a, b in zip(in_cpp, in_python):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        for x, y in zip(a, b):
            assert torch.equal(x["score"], y["score"]) and torch.equal(
                x["positional_scores"], y["positional_scores"]
            )


def test_a_nan_logit_takes_the_python_loop():
    """A NaN logit (a broken checkpoint): the C++ loop declines the batch and the Python loop's masks decide, as
    on the eager step."""
    model = tiny_model(seed=10)
    with torch.no_grad():
        model.decoder.embed_tokens.weight[7, 0] = float("nan")  # (tied: token 7's logit, and its embedding)
    srcs = left_pad(sources(5, seed=4))
    found = []
    search = cpu_step.CompiledSteps.search
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_step.CompiledSteps, "search", lambda *a: found.append(search(*a)) or found[-1])
        got = SequenceGenerator(model, Dict4(), beam_size=3, max_len_b=8).generate(srcs)
    assert found == [None]
    want = SequenceGenerator(model, Dict4(), beam_size=3, max_len_b=8, cpu_step=False).generate(srcs)
    assert [[h["tokens"].tolist() for h in s] for s in got] == [
        [h["tokens"].tolist() for h in s] for s in want
    ]


def test_int8_compiled_search_gives_the_eager_int8_hypotheses():
    """With every source the same length (no pads: dynamic quantization then sees the same activations in
    both encoders), the compiled step runs the model's own int8 linears: the eager int8 hypotheses."""
    model = quantize_int8(tiny_model(seed=4))
    g = torch.Generator().manual_seed(5)
    srcs = torch.cat([torch.randint(4, V, (8, 7), generator=g), torch.full((8, 1), EOS)], dim=1)
    for kw in (
        dict(beam_size=4, max_len_b=12, nbest=2),
        dict(beam_size=2, max_len_b=10, no_repeat_ngram_size=2),
    ):
        eager = SequenceGenerator(model, Dict4(), cpu_step=False, **kw).generate(srcs)
        assert_same_hypotheses(SequenceGenerator(model, Dict4(), **kw).generate(srcs), eager, tol=1e-4)
    assert cpu_step.PackedModel.get(model).backend == "int8"


def test_packed_weights_follow_parameters_changed_in_place():
    """Training between two generations (a ROUGE validation) changes the parameters in place: the next search
    repacks them and gives the eager hypotheses of the new weights."""
    model = tiny_model(seed=5)
    srcs = left_pad(sources(6, seed=8))
    first = cpu_step.PackedModel.get(model)
    before = SequenceGenerator(model, Dict4(), beam_size=3, max_len_b=10).generate(srcs)
    assert cpu_step.PackedModel.get(model) is first  # kept while nothing changes
    # torch's fused AdamW updates in place without counting versions (as seqtrain-train's Adam does)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    versions = [p._version for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    assert [p._version for p in model.parameters()] == versions
    second = cpu_step.PackedModel.get(model)
    assert second is not first
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    assert cpu_step.PackedModel.get(model) is not second
    after = SequenceGenerator(model, Dict4(), beam_size=3, max_len_b=10).generate(srcs)
    assert_same_hypotheses(
        after, SequenceGenerator(model, Dict4(), cpu_step=False, beam_size=3, max_len_b=10).generate(srcs)
    )
    assert [h[0]["tokens"].tolist() for h in after] != [h[0]["tokens"].tolist() for h in before]


def test_models_the_step_does_not_take_run_eagerly():
    model = tiny_model(seed=6)
    assert cpu_step.for_model(model.train()) is None  # training mode
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cpu_step.for_model(model) is None
    assert cpu_step.for_model(model.to(torch.float64)) is None
    assert cpu_step.for_model(tiny_model(seed=6, activation_fn="tanh")) is None


SCRIPT = """
import sys, torch
sys.path.insert(0, {repo!r})
from seqtrain.generation import cpu_step
from seqtrain.generation.sequence_generator import SequenceGenerator
from tests.unit.generation.test_sequence_generator import Dict4, left_pad, sources, tiny_model
model = tiny_model(seed=3)
srcs = left_pad(sources(5, seed=2))
hyps = SequenceGenerator(model, Dict4(), beam_size=3, max_len_b=8).generate(srcs)
print("EXT", cpu_step.extension() is not None)
print("HYPS", [h[0]["tokens"].tolist() for h in hyps])
"""


@pytest.mark.slow
def test_without_a_compiler_the_eager_step_runs_and_says_so(tmp_path):
    """No C++ compiler and no ninja on PATH, a fresh extension cache: generation works (the eager step's
    hypotheses) and the log has one line naming the reason."""
    code = SCRIPT.format(repo=str(REPO))
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {
        **os.environ,
        "PATH": str(empty),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
        "CXX": "no-such-compiler",
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EXT False" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "compiled CPU decoding step is unavailable" in line]
    assert len(lines) == 1 and ("ninja" in lines[0] or "compiler" in lines[0])
    model = tiny_model(seed=3)
    want = SequenceGenerator(model, Dict4(), cpu_step=False, beam_size=3, max_len_b=8).generate(
        left_pad(sources(5, seed=2))
    )
    assert f"HYPS {[h[0]['tokens'].tolist() for h in want]}" in proc.stdout


def test_eager_setting_turns_the_compiled_step_off(monkeypatch):
    model = tiny_model(seed=7)
    monkeypatch.setenv("SEQTRAIN_CPU_STEP", "eager")
    assert cpu_step.for_model(model) is None
    monkeypatch.setenv("SEQTRAIN_CPU_STEP", "sometimes")
    with pytest.raises(ValueError, match="SEQTRAIN_CPU_STEP"):
        cpu_step.for_model(model)


# ------------------------------------------------------------------ (d) the products


@pytest.mark.parametrize("backend", ["onednn", "dense"])
@pytest.mark.parametrize("act", ["none", "gelu", "gelu_accurate", "relu"])
def test_linear_specs_apply_activation_and_residual(backend, act, monkeypatch):
    if backend == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("torch has no oneDNN here")
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    x, res = torch.randn(7, 32, generator=g), torch.randn(7, 48, generator=g)
    spec = LinearSpec.of(w, b, backend, rows=128)
    acts = {
        "none": lambda y: y,
        "gelu": F.gelu,
        "gelu_accurate": lambda y: F.gelu(y, approximate="tanh"),
        "relu": F.relu,
    }
    want = acts[act](F.linear(x, w, b))
    torch.testing.assert_close(run_linear(spec, x, act), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run_linear(spec, x, act, res), res + want, rtol=1e-5, atol=1e-5)
    native = cpu_step.extension().Linear(spec.kind, spec.weight, spec.bias, None, spec.out)
    code = {"none": 0, "gelu": 1, "gelu_accurate": 2, "relu": 3}[act]
    torch.testing.assert_close(
        cpu_step.extension().linear(native, x, code, res), res + want, rtol=1e-5, atol=1e-5
    )


def test_row_buckets_bound_the_shapes_and_the_padding():
    """oneDNN keeps a primitive per shape: products run at bucketed row counts (C++ and Python the same rule),
    a few dozen shapes for every row count a search meets, never more than 12.5% (or 7 rows) of padding."""
    from seqtrain.models.cpu_products import bucket_rows

    ext = cpu_step.extension()
    buckets = set()
    for m in range(1, 5000):
        b = bucket_rows(m)
        assert b == ext.bucket_rows(m) and b >= m and bucket_rows(b) == b
        assert b <= max(2 * m, m + 7, m * 1.125 + 1)
        buckets.add(b)
    assert len([b for b in buckets if b <= 128]) == 15 and len(buckets) < 60


def test_gemm_backend_follows_the_vendor_and_the_setting(monkeypatch):
    monkeypatch.setenv("SEQTRAIN_CPU_GEMM", "mkl")
    assert gemm_backend() == "dense"
    monkeypatch.setenv("SEQTRAIN_CPU_GEMM", "onednn")
    assert gemm_backend() == ("onednn" if torch.backends.mkldnn.is_available() else "dense")
    monkeypatch.setenv("SEQTRAIN_CPU_GEMM", "")
    monkeypatch.setattr("seqtrain.models.cpu_products.cpu_vendor", lambda: "GenuineIntel")
    assert gemm_backend() == "dense"
    monkeypatch.setattr("seqtrain.models.cpu_products.cpu_vendor", lambda: "AuthenticAMD")
    assert gemm_backend() == ("onednn" if torch.backends.mkldnn.is_available() else "dense")
    monkeypatch.setenv("SEQTRAIN_CPU_GEMM", "fast")
    with pytest.raises(ValueError, match="SEQTRAIN_CPU_GEMM"):
        gemm_backend()
