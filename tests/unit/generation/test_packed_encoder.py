"""Generation's encoder pass packed (--packed-encoder) against padded: where the work runs, never the result.

(a) The encoder: BartEncoder(packed=True) runs the padded batch's real tokens through the packed stack
    (models/varlen.py's dispatcher) and lays them out B x S again; its real rows equal the padded pass's (fp64 to
    1e-12, fp32 to 1e-6) on left- and right-padded batches of mixed lengths, a length-1 source and a batch with
    no pads, post-norm (BART) and pre-norm (mBART: normalize_before, a final layer norm); the pad mask is the
    same and the pad rows are zero.
(b) Above the encoder nothing changes: fp32 hypotheses and scores of the eager loop and of the static path
    (--static-decoding) are the padded pass's over many seeds, beams 1-5, nbest, min/max length, prefixes,
    n-gram blocking and sampling with a seed; ensembles, --score-reference and mBART too.
(c) The default and the flag: packed on CUDA where the varlen kernel serves, on the CPU from
    CPU_PACK_MIN_PAD_SHARE pads up; --packed-encoder / --no-packed-encoder force it; Summarizer takes it as a
    generation flag and checks its kind.
(d) On CUDA (skipped without one): bf16 through torch's varlen flash kernel, fp32 through the reference.
"""

from __future__ import annotations

import argparse
import itertools

import pytest
import torch

from seqtrain.config import add_settings
from seqtrain.errors import SeqtrainError
from seqtrain.generation.ensemble import EnsembleModel
from seqtrain.generation.scorer import SequenceScorer
from seqtrain.generation.search import GenerationConfig, Sampling, check_generation_args, generation_config
from seqtrain.generation.sequence_generator import SequenceGenerator, build_generator, encode
from seqtrain.models.bart import CPU_PACK_MIN_PAD_SHARE, BARTModel
from tests.unit.generation.test_sequence_generator import (
    EOS,
    PAD,
    Dict4,
    V,
    left_pad,
    sources,
    tiny_model,
)
from tests.unit.generation.test_static_decoding import FLAGS, RowwiseModel, _prefix
from tests.utils import FP32

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def model_of(seed: int = 0, dtype: torch.dtype = torch.float32, pre_norm: bool = False) -> BARTModel:
    """A tiny BART (peaked weights, as the generator tests'); `pre_norm`: mBART's layout."""
    if not pre_norm:
        return tiny_model(seed).to(dtype)
    m = tiny_model(seed, scale_eos=False, encoder_normalize_before=True, decoder_normalize_before=True)
    assert m.encoder.layer_norm is not None
    return m.to(dtype)


def batch_of(lengths: list[int], seed: int = 0, left: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(4, V, (n - 1,), generator=g).tolist() + [EOS] for n in lengths]
    width = max(lengths)
    return torch.tensor(
        [[PAD] * (width - len(s)) + s if left else s + [PAD] * (width - len(s)) for s in seqs]
    )


BATCHES = {
    "mixed": [13, 5, 1, 9, 13, 2],  # a length-1 source (its EOS alone)
    "no_pads": [7, 7, 7],
    "one": [1],
    "one_long": [31],
}


# ------------------------------------------------------------------ (a) the encoder


@pytest.mark.parametrize("dtype, tol", [(torch.float64, {"rtol": 0, "atol": 1e-12}), (torch.float32, FP32)])
@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_packed_encoder_output_is_the_padded_one(dtype, tol, pre_norm, left, name):
    model = model_of(1, dtype, pre_norm)
    src = batch_of(BATCHES[name], seed=len(name), left=left)
    with torch.no_grad():
        want = model.encoder(src, packed=False)
        got = model.encoder(src, packed=True)
    real = src.ne(PAD)
    assert torch.equal(got["encoder_padding_mask"], want["encoder_padding_mask"])
    assert got["encoder_out"].shape == want["encoder_out"].shape and got["encoder_out"].dtype == dtype
    torch.testing.assert_close(got["encoder_out"][real], want["encoder_out"][real], **tol)
    assert not got["encoder_out"][~real].any()  # pads: zeros, which every reader masks


def test_a_non_contiguous_batch_packs_too():
    """src_tokens as a view (the batch's rows every other one, its first column dropped): the same output."""
    model = model_of(3)
    wide = batch_of([9, 3, 6, 1, 8, 4], seed=5)
    src = wide[::2, 1:]
    assert not src.is_contiguous()
    with torch.no_grad():
        got = model.encoder(src, packed=True)["encoder_out"]
        want = model.encoder(src.contiguous(), packed=False)["encoder_out"]
    real = src.ne(PAD)
    torch.testing.assert_close(got[real], want[real], **FP32)


def test_packed_positions_start_where_make_positions_starts():
    """A left-padded row's first real token gets position padding_idx + 1, as fairseq's make_positions: the
    packed rows of a row equal that row encoded alone, unpadded."""
    model = model_of(2)
    src = batch_of([9, 3, 6], seed=3)
    with torch.no_grad():
        out = model.encoder(src, packed=True)["encoder_out"]
        for i in range(src.size(0)):
            alone = src[i][src[i].ne(PAD)].unsqueeze(0)
            torch.testing.assert_close(
                out[i][src[i].ne(PAD)],
                model.encoder(alone, packed=False)["encoder_out"][0],
                **FP32,
            )


# ------------------------------------------------------------------ (b) generation above the encoder


def _assert_identical(a, b, tol=0.0):
    """The same hypotheses in the same order; scores equal (to `tol`, absolute and relative)."""
    assert len(a) == len(b)
    for hyps_a, hyps_b in zip(a, b):
        assert [h["tokens"].tolist() for h in hyps_a] == [h["tokens"].tolist() for h in hyps_b]
        for x, y in zip(hyps_a, hyps_b):
            torch.testing.assert_close(x["score"], y["score"], rtol=tol, atol=tol)
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"], rtol=tol, atol=tol)


def _pair(model, beam, flags, **extra):
    kw = dict(flags)
    nbest = beam if kw.pop("nbest", 1) == -1 else 1
    return [
        SequenceGenerator(model, Dict4(), beam_size=beam, nbest=nbest, packed_encoder=p, **kw, **extra)
        for p in (True, False)
    ]


TOL = 1e-5  # fp32 scores after a search of several steps on those outputs (the tokens: exactly the same)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", sorted(FLAGS))
@pytest.mark.parametrize("beam", [1, 2, 3, 4, 5])
def test_generation_is_the_padded_encoders(static, name, beam):
    for seed in range(3):
        model = model_of(seed)
        srcs = left_pad(sources(3 + 2 * seed, seed=seed + 7 * beam, lo=1, hi=14))
        packed, padded = _pair(model, beam, FLAGS[name], static_decoding=static)
        _assert_identical(packed.generate(srcs), padded.generate(srcs), TOL)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("pre_norm", [False, True])
def test_generation_with_prefix(static, pre_norm):
    for seed, beam in itertools.product(range(3), (1, 3, 5)):
        model = model_of(seed, pre_norm=pre_norm)
        srcs = left_pad(sources(6, seed=seed + 40, lo=1, hi=12))
        prefix = _prefix(srcs, seed)
        packed, padded = _pair(model, beam, dict(max_len_b=10, min_len=2, nbest=-1), static_decoding=static)
        _assert_identical(
            packed.generate(srcs, prefix_tokens=prefix), padded.generate(srcs, prefix_tokens=prefix), TOL
        )


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("kw", [dict(), dict(topk=3), dict(topp=0.6)])
def test_sampling_with_a_seed_draws_the_same(static, kw):
    for seed in range(3):
        model = model_of(seed)
        srcs = left_pad(sources(5, seed=seed + 60, lo=1, hi=12))
        gens = [
            SequenceGenerator(
                model,
                Dict4(),
                beam_size=3,
                nbest=3,
                max_len_b=12,
                packed_encoder=p,
                static_decoding=static,
                search_strategy=Sampling(
                    kw.get("topk", -1), kw.get("topp", -1.0), torch.Generator().manual_seed(seed)
                ),
            )
            for p in (True, False)
        ]
        _assert_identical(gens[0].generate(srcs), gens[1].generate(srcs), TOL)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("name", ["beam", "nbest_lenpen2_minlen", "ngram2_unkpen"])
def test_mbart_pre_norm(static, name):
    for seed in range(3):
        model = model_of(seed, pre_norm=True)
        srcs = left_pad(sources(5, seed=seed + 80, lo=1, hi=14))
        packed, padded = _pair(model, 4, FLAGS[name], static_decoding=static)
        _assert_identical(packed.generate(srcs), padded.generate(srcs), TOL)


def test_ensemble_encoders_run_packed():
    members = [model_of(0), model_of(1)]
    ens = EnsembleModel(members)
    assert ens.encoder.supports_packed
    srcs = left_pad(sources(6, seed=5, lo=1, hi=14))
    with torch.no_grad():
        outs = encode(ens, srcs, None, True)
    for member, out in zip(members, outs):
        with torch.no_grad():
            want = member.encoder(srcs, packed=False)
        real = srcs.ne(PAD)
        torch.testing.assert_close(out["encoder_out"][real], want["encoder_out"][real], **FP32)
    for beam in (1, 4):
        packed, padded = _pair(ens, beam, dict(max_len_b=12, nbest=-1))
        _assert_identical(packed.generate(srcs), padded.generate(srcs), TOL)


def _scored_sample(srcs, tgts):
    target = torch.tensor([t + [PAD] * (max(map(len, tgts)) - len(t)) for t in tgts])
    prev = torch.cat([torch.full((len(tgts), 1), EOS), target[:, :-1]], dim=1)
    prev = prev.masked_fill(prev.eq(EOS) & (torch.arange(prev.size(1)) > 0), PAD)
    return {
        "id": torch.arange(len(tgts)),
        "net_input": {"src_tokens": left_pad(srcs), "src_lengths": None, "prev_output_tokens": prev},
        "target": target,
    }


@pytest.mark.parametrize("ensemble", [False, True])
def test_score_reference_is_the_padded_encoders(ensemble):
    """--score-reference: the decoder runs padded (it gathers from B x T x V); its encoder pass is packed."""
    srcs, tgts = sources(6, seed=11, lo=1, hi=14), sources(6, seed=12, lo=1, hi=9)
    model = EnsembleModel([model_of(0), model_of(1)]) if ensemble else model_of(0)
    sample = _scored_sample(srcs, tgts)
    got = SequenceScorer(model, Dict4(), packed_encoder=True).score_batch(sample)
    want = SequenceScorer(model, Dict4(), packed_encoder=False).score_batch(sample)
    for (ia, [a]), (ib, [b]) in zip(got, want):
        assert ia == ib and torch.equal(a["tokens"], b["tokens"])
        torch.testing.assert_close(
            a["positional_scores"], b["positional_scores"], rtol=FP32["rtol"], atol=TOL
        )
        torch.testing.assert_close(a["score"], b["score"], rtol=FP32["rtol"], atol=TOL)


def test_an_encoder_without_the_packed_pass_runs_as_before():
    """A caller's own model (no supports_packed) decodes as it always did, whatever the setting."""
    model = RowwiseModel(0)
    srcs = left_pad(sources(4, seed=3))
    packed, padded = _pair(model, 3, dict(max_len_b=8))
    _assert_identical(packed.generate(srcs), padded.generate(srcs))


# ------------------------------------------------------------------ (c) the default and the flag


def test_cpu_default_packs_from_the_pad_share():
    model = model_of(0)
    enc = model.encoder
    no_pads = batch_of([6, 6, 6, 6])
    few = batch_of([10] * 9 + [9])  # 1 pad in 100
    many = batch_of([10, 10, 2, 2])  # 16 pads in 40
    assert not enc.packs_by_default(no_pads.eq(PAD))
    assert not enc.packs_by_default(few.eq(PAD))
    assert float(many.eq(PAD).float().mean()) >= CPU_PACK_MIN_PAD_SHARE
    assert enc.packs_by_default(many.eq(PAD))
    with torch.no_grad():  # the default (None) gives the same output as either forced choice
        for src in (no_pads, many):
            real = src.ne(PAD)
            auto = model.encoder(src, packed=None)["encoder_out"][real]
            torch.testing.assert_close(auto, model.encoder(src)["encoder_out"][real], **FP32)


def test_packed_encoder_flag():
    model = model_of(0)
    parser = argparse.ArgumentParser()
    add_settings(parser, GenerationConfig)

    def config(*argv):
        return generation_config(parser.parse_args(list(argv)))

    assert build_generator(model, Dict4(), config()).packed_encoder is None  # the encoder decides
    assert build_generator(model, Dict4(), config("--packed-encoder")).packed_encoder is True
    assert build_generator(model, Dict4(), config("--no-packed-encoder")).packed_encoder is False
    bad = parser.parse_args([])
    bad.packed_encoder = "yes"  # as Summarizer.summarize(packed_encoder="yes") sets it
    with pytest.raises(SeqtrainError, match=r"^--packed-encoder must be True, False or None, got 'yes'$"):
        check_generation_args(bad)
    with pytest.raises(SeqtrainError, match=r"^Summarizer.summarize\(static_decoding=...\) must be True"):
        bad.packed_encoder, bad.static_decoding = None, "on"
        check_generation_args(bad, lambda dest: f"Summarizer.summarize({dest}=...)")


# ------------------------------------------------------------------ (d) CUDA


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_precision_packs_through_the_varlen_kernel(dtype):
    from seqtrain.models.varlen import varlen_kernel

    if varlen_kernel() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    model = model_of(1, dtype).cuda()
    src = batch_of(BATCHES["mixed"], seed=4).cuda()
    assert model.encoder.packs_by_default(src.eq(PAD))  # the default on CUDA
    with torch.no_grad():
        got = model.encoder(src, packed=True)["encoder_out"]
        want = model.encoder(src, packed=False)["encoder_out"]
        ref = model_of(1, torch.float64).encoder(src.cpu())["encoder_out"]
    real = src.ne(PAD)
    # both against fp64: the packed pass is as close to exact as the padded one (rounding of `dtype`)
    err_packed = (got[real].double().cpu() - ref[real.cpu()]).abs().max()
    err_padded = (want[real].double().cpu() - ref[real.cpu()]).abs().max()
    assert err_packed <= 2 * err_padded + 1e-3
    assert not got[~real].any()


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("static", [False, True])
def test_cuda_fp32_generation_is_the_padded_encoders(static):
    model = model_of(0).cuda()
    assert not model.encoder.packs_by_default(
        torch.zeros(2, 3, dtype=torch.bool, device="cuda")
    )  # fp32: padded
    srcs = left_pad(sources(7, seed=9, lo=1, hi=14)).cuda()
    packed, padded = _pair(model, 4, dict(max_len_b=12, nbest=-1), static_decoding=static)
    _assert_identical(packed.generate(srcs), padded.generate(srcs), 1e-5)


@pytest.mark.cuda
@CUDA
def test_cuda_packed_pass_syncs_no_more_than_the_padded_one():
    """The padded pass reads whether there are pads (one sync); the packed one reads the row lengths instead
    and finds the rows with nonzero_static (no second sync)."""
    import warnings

    model = model_of(1, torch.bfloat16).cuda()
    src = batch_of(BATCHES["mixed"], seed=4).cuda()
    counts = {}
    for packed in (False, True, False, True):  # (the second round: warmed up)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model.encoder(src, packed=packed)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[packed] = sum("synchroniz" in str(w.message) for w in caught)
    assert counts[True] <= max(counts[False], 1), counts
