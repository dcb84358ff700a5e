"""The batched generator against a slow reference, batch invariance, n-gram blocking, sampling, prefixes, flags,
and Hugging Face transformers' beam search on the same weights."""

import argparse
import math

import pytest
import torch

from seqtrain.config import add_settings
from seqtrain.errors import SeqtrainError
from seqtrain.generation.ngram import NGramRepeatBlocker, has_repeated_ngram
from seqtrain.generation.search import GenerationConfig, Sampling, check_generation_args, generation_config
from seqtrain.generation.sequence_generator import SequenceGenerator, build_generator, generate_batch
from seqtrain.models.bart import BartConfig, BARTModel
from tests.unit.generation.reference_beam_search import fairseq_forced_eos, reference_beam_search

PAD, EOS, UNK, V = 1, 2, 3, 24


class Dict4:
    def pad(self):
        return PAD

    def eos(self):
        return EOS

    def unk(self):
        return UNK

    def bos(self):
        return 0


def peaked_init_(named_params, eos_row_scale=3.0):
    """Random weights with clearly separated scores (the default init gives near-uniform logits, where beam
    rankings would hinge on float rounding) and an EOS likely enough that hypotheses end at varied lengths."""
    with torch.no_grad():
        for name, p in named_params:
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            elif p.dim() == 1:
                p.normal_(0.0, 0.1)
            elif "embed_tokens" in name or "shared" in name:
                p.normal_(0.0, 0.3)
            elif "embed_positions" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.size(1) ** -0.5)


def tiny_model(seed=0, max_pos=64, scale_eos=True, **config):
    """A tiny BART with peaked weights; `config`: more BartConfig fields (pre-norm, ...); `scale_eos`: the EOS
    embedding row scaled up, so hypotheses end at varied lengths."""
    torch.manual_seed(seed)
    m = BARTModel(
        BartConfig(
            vocab_size=V,
            encoder_layers=2,
            decoder_layers=2,
            encoder_embed_dim=32,
            decoder_embed_dim=32,
            encoder_ffn_embed_dim=64,
            decoder_ffn_embed_dim=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            max_source_positions=max_pos,
            max_target_positions=max_pos,
            dropout=0.0,
            **config,
        ),
        padding_idx=PAD,
    )
    peaked_init_(m.named_parameters())
    if scale_eos:
        with torch.no_grad():
            m.encoder.embed_tokens.weight[EOS] *= 3.0
    return m.eval()


def sources(n, seed=1, lo=3, hi=10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(4, V, (k,), generator=g).tolist() + [EOS] for k in lengths]


def left_pad(seqs):
    width = max(map(len, seqs))
    return torch.tensor([[PAD] * (width - len(s)) + s for s in seqs])


@pytest.fixture(scope="module")
def model():
    return tiny_model()


# ------------------------------------------------------------------ (a) the fast generator == the slow reference

VARIANTS = {
    "default": dict(beam=4, max_len_b=15, nbest=4),
    "lenpen2_minlen_nbest": dict(beam=4, max_len_b=12, len_penalty=2.0, min_len=6, nbest=4),
    "short_maxlen": dict(beam=3, max_len_b=4, nbest=3),
    "maxlen_a_per_sentence": dict(beam=3, max_len_a=1.5, max_len_b=1, nbest=2),
    "ngram2": dict(beam=4, max_len_b=14, no_repeat_ngram_size=2, nbest=4),
    "ngram3_unkpen_lenpen05": dict(
        beam=5, max_len_b=12, no_repeat_ngram_size=3, unk_penalty=-2.0, len_penalty=0.5
    ),
    "beam1_temperature": dict(beam=1, max_len_b=10, temperature=0.7),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_matches_reference(model, name):
    kw = dict(VARIANTS[name])
    beam, nbest = kw.pop("beam"), kw.pop("nbest", 1)
    srcs = sources(4, seed=sorted(VARIANTS).index(name))
    gen = SequenceGenerator(
        model,
        Dict4(),
        beam_size=beam,
        nbest=nbest,
        max_len_a=kw.get("max_len_a", 0.0),
        max_len_b=kw["max_len_b"],
        min_len=kw.get("min_len", 1),
        len_penalty=kw.get("len_penalty", 1.0),
        unk_penalty=kw.get("unk_penalty", 0.0),
        temperature=kw.get("temperature", 1.0),
        no_repeat_ngram_size=kw.get("no_repeat_ngram_size", 0),
    )
    fast = gen.generate(left_pad(srcs))
    lengths = set()
    for src, hypos in zip(srcs, fast):
        ref = reference_beam_search(model, src, beam, nbest=nbest, **kw)
        assert len(hypos) == len(ref) == nbest
        for h, r in zip(hypos, ref):
            assert h["tokens"].tolist() == r["tokens"]
            assert float(h["score"]) == pytest.approx(r["score"], abs=1e-5)
            assert h["positional_scores"].tolist() == pytest.approx(r["positional_scores"], abs=1e-5)
            assert h["alignment"] is None
            lengths.add(len(r["tokens"]))
    if name == "default":
        assert len(lengths) > 1, "the test model should end hypotheses at different lengths"


def test_length_conventions(model):
    """min_len counts tokens before EOS; max_len caps them (EOS forced); the score is normalized with the EOS
    counted in the length."""
    gen = SequenceGenerator(model, Dict4(), beam_size=4, nbest=4, max_len_b=7, min_len=5, len_penalty=1.5)
    for hypos in gen.generate(left_pad(sources(3))):
        for h in hypos:
            toks = h["tokens"].tolist()
            assert toks[-1] == EOS and EOS not in toks[:-1] and PAD not in toks
            assert 5 <= len(toks) - 1 <= 7
            total = float(h["positional_scores"].sum())
            assert float(h["score"]) == pytest.approx(total / len(toks) ** 1.5, abs=1e-5)
        assert [float(h["score"]) for h in hypos] == sorted((float(h["score"]) for h in hypos), reverse=True)


def test_unnormalized_and_match_source_len(model):
    srcs = sources(3)
    gen = SequenceGenerator(
        model, Dict4(), beam_size=3, nbest=3, normalize_scores=False, match_source_len=True
    )
    for src, hypos in zip(srcs, gen.generate(left_pad(srcs))):
        for h in hypos:
            assert float(h["score"]) == pytest.approx(float(h["positional_scores"].sum()), abs=1e-5)
            assert len(h["tokens"]) - 1 <= len(src) - 1  # at most the source length (its EOS excluded)


# ------------------------------------------------------------------ (e) batch invariance


def test_batch_invariance(model):
    srcs = sources(8, seed=7, lo=2, hi=12)
    gen = SequenceGenerator(
        model, Dict4(), beam_size=4, nbest=2, max_len_a=1.2, max_len_b=3, no_repeat_ngram_size=3
    )
    together = gen.generate(left_pad(srcs))
    for src, hypos in zip(srcs, together):
        alone = gen.generate(torch.tensor([src]))[0]
        assert [h["tokens"].tolist() for h in hypos] == [h["tokens"].tolist() for h in alone]
        for a, b in zip(hypos, alone):
            assert float(a["score"]) == pytest.approx(float(b["score"]), abs=1e-5)
            assert torch.allclose(a["positional_scores"], b["positional_scores"], atol=1e-5)


# ------------------------------------------------------------------ (d) n-gram blocking


def test_ngram_blocker_matches_python():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 8, (6, 12), generator=g)  # small alphabet: many repeats
    tokens[:, 0] = EOS
    for n in (1, 2, 3, 4):
        lprobs = NGramRepeatBlocker(n)(tokens, torch.zeros(6, 10))
        for r in range(6):
            seq = tokens[r].tolist()
            if n == 1:
                expect = set(seq[1:])
            else:
                tail = seq[len(seq) - n + 1 :]
                expect = {seq[i + n - 1] for i in range(len(seq) - n + 1) if seq[i : i + n - 1] == tail}
            assert {i for i in range(10) if lprobs[r, i] == -math.inf} == expect


@pytest.mark.parametrize("n", [2, 3])
def test_no_repeated_ngrams_in_output(model, n):
    srcs = left_pad(sources(6, seed=3))
    plain = SequenceGenerator(model, Dict4(), beam_size=4, nbest=4, max_len_b=15).generate(srcs)
    assert any(
        has_repeated_ngram(h["tokens"].tolist(), n) for hs in plain for h in hs
    )  # blocking has work to do
    blocked = SequenceGenerator(model, Dict4(), beam_size=4, nbest=4, max_len_b=15, no_repeat_ngram_size=n)
    for hypos in blocked.generate(srcs):
        assert len(hypos) == 4
        for h in hypos:
            assert not has_repeated_ngram([EOS] + h["tokens"].tolist()[:-1], n)


# ------------------------------------------------------------------ (f) sampling


def _sampler(model, seed, **kw):
    gen = torch.Generator().manual_seed(seed)
    return SequenceGenerator(
        model, Dict4(), beam_size=3, max_len_b=10, search_strategy=Sampling(generator=gen, **kw)
    )


def test_sampling_reproducible_with_seed(model):
    srcs = left_pad(sources(4))
    runs = [
        [[h["tokens"].tolist() for h in hs] for hs in _sampler(model, s).generate(srcs)] for s in (5, 5, 6)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    distinct = {tuple(t) for hs in runs[0] for t in hs}
    assert len(distinct) > len(runs[0])  # samples differ within a sentence


@pytest.mark.parametrize("kw", [dict(topk=2), dict(topp=0.5)])
def test_sampling_respects_topk_topp(model, kw):
    srcs = sources(3)
    hypos = _sampler(model, 0, **kw).generate(left_pad(srcs))
    for src, hs in zip(srcs, hypos):
        for h in hs:
            toks = h["tokens"].tolist()
            prefix = [EOS] + toks[:-1]
            with torch.no_grad():
                logits, _ = model(torch.tensor([src]), None, torch.tensor([prefix]))
            for i, tok in enumerate(toks):
                if i == 10:
                    assert tok == EOS  # forced at max_len_b
                    continue
                probs = torch.softmax(logits[0, i].float(), dim=-1)
                probs[PAD] = 0
                if i < 1:
                    probs[EOS] = 0  # min_len 1
                order = probs.argsort(descending=True).tolist()
                if "topk" in kw:
                    assert order.index(tok) < kw["topk"]
                else:
                    assert float(probs[order[: order.index(tok)]].sum()) < kw["topp"]
            # the score is the drawn tokens' log-probability, normalized by length
            lp = torch.log_softmax(logits[0].float(), dim=-1).gather(1, torch.tensor(toks)[:, None]).sum()
            assert float(h["score"]) == pytest.approx(float(lp) / len(toks), abs=1e-4)


# ------------------------------------------------------------------ prefixes, batch helper, flags


def test_prefix_tokens_forced(model):
    srcs = left_pad(sources(3))
    prefix = torch.tensor([[5, 6], [7, PAD], [8, 9]])
    out = SequenceGenerator(model, Dict4(), beam_size=3, nbest=3, max_len_b=8).generate(
        srcs, prefix_tokens=prefix
    )
    for p, hypos in zip(prefix.tolist(), out):
        want = [t for t in p if t != PAD]
        assert len(hypos) == 3 and all(h["tokens"].tolist()[: len(want)] == want for h in hypos)
    # a prefix ending in EOS ends the hypothesis there, in every beam slot (fairseq copies the first beam)
    out = SequenceGenerator(model, Dict4(), beam_size=3, nbest=3, max_len_b=8).generate(
        srcs[:1], prefix_tokens=torch.tensor([[5, EOS]])
    )
    assert [h["tokens"].tolist() for h in out[0]] == [[5, EOS]] * 3
    lp = torch.log_softmax(model(srcs[:1], None, torch.tensor([[EOS, 5]]))[0][0].float(), dim=-1).detach()
    assert out[0][0]["positional_scores"].tolist() == pytest.approx(
        [lp[0, 5].item(), lp[1, EOS].item()], abs=1e-5
    )


def test_generate_batch_keeps_sample_order(model):
    srcs = sources(4)
    sample = {
        "id": torch.tensor([11, 3, 7, 0]),
        "net_input": {"src_tokens": left_pad(srcs), "src_lengths": torch.tensor([len(s) for s in srcs])},
        "target": torch.tensor([[9, 9, EOS], [10, EOS, PAD], [11, 12, EOS], [13, EOS, PAD]]),
    }
    args = argparse.ArgumentParser()
    add_settings(args, GenerationConfig)
    args = args.parse_args(["--beam", "3", "--max-len-b", "9", "--prefix-size", "1"])
    gen = build_generator(model, Dict4(), generation_config(args))
    out = generate_batch(gen, sample, prefix_size=args.prefix_size, force_bos=0)
    assert [i for i, _ in out] == [11, 3, 7, 0]
    for (_i, hypos), first in zip(out, [9, 10, 11, 13]):
        assert len(hypos) == 1 and hypos[0]["tokens"].tolist()[:2] == [0, first]
    alone = SequenceGenerator(model, Dict4(), beam_size=3, nbest=1, max_len_b=9).generate(
        torch.tensor([srcs[2]]), prefix_tokens=torch.tensor([[0, 11]])
    )
    assert out[2][1][0]["tokens"].tolist() == alone[0][0]["tokens"].tolist()


def test_flags_defaults_and_errors():
    parser = argparse.ArgumentParser()
    add_settings(parser, GenerationConfig)
    a = parser.parse_args([])
    assert (a.beam, a.nbest, a.lenpen, a.unkpen, a.max_len_a, a.max_len_b, a.min_len) == (
        5,
        1,
        1.0,
        0.0,
        0,
        200,
        1,
    )
    assert (a.no_repeat_ngram_size, a.prefix_size, a.sampling, a.sampling_topk, a.sampling_topp) == (
        0,
        0,
        False,
        -1,
        -1.0,
    )
    assert a.temperature == 1.0 and not a.match_source_len and not a.no_early_stop
    check_generation_args(a)
    for argv, msg in [
        (["--nbest", "6"], "--nbest"),
        (["--sampling", "--beam", "2"], "--sampling requires --nbest"),
        (["--sampling-topk", "5"], "need --sampling"),
        (["--sampling", "--sampling-topp", "1.5", "--nbest", "5"], "--sampling-topp"),
        (["--temperature", "0"], "--temperature"),
    ]:
        with pytest.raises(SeqtrainError, match=msg):
            check_generation_args(parser.parse_args(argv))


def test_min_len_above_max_len_is_an_error(model):
    """fairseq's keywords are checked as the flags are, each named as given (the one check of the settings);
    the step body holds --min-len against the model's own positions."""
    with pytest.raises(SeqtrainError, match="min_len 9 is above the maximum length max_len_b 5"):
        SequenceGenerator(model, Dict4(), max_len_b=5, min_len=9)
    with pytest.raises(SeqtrainError, match="beam_size must be between 1 and 10000, got 0"):
        SequenceGenerator(model, Dict4(), beam_size=0)
    with pytest.raises(SeqtrainError, match="--min-len 9 is larger than the max length 7"):
        SequenceGenerator(model, Dict4(), max_len=8, max_len_b=20, min_len=9)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beam'"):
        SequenceGenerator(model, Dict4(), beam=4)


def test_generate_restores_training_mode(model):
    model.train()
    try:
        SequenceGenerator(model, Dict4(), beam_size=2, max_len_b=3).generate(left_pad(sources(2)))
        assert model.training
    finally:
        model.eval()


# ------------------------------------------------------------------ (b) transformers' beam search, same weights


@pytest.mark.slow
def test_matches_transformers_generate():
    """Conventions: HF's max_length counts the decoder start token and the EOS, so max_length = max_len + 2 and
    min_length = min_len + 1 (HF masks EOS while the sequence incl. the start token is shorter than min_length).
    HF does not forbid pad by itself (suppress_tokens=[pad]). HF's forced_eos_token_id gives the forced EOS a
    log-prob of 0, fairseq keeps its real log-prob, which changes scores and so rankings of hypotheses that reach
    max length: a small processor forces EOS the fairseq way instead. Both divide by (tokens incl. EOS) **
    length_penalty and, with early_stopping=True, stop a sentence at num_beams finished hypotheses. The best
    hypothesis agrees; lower ranks can differ because HF keeps the best num_beams finished, fairseq the first."""
    transformers = pytest.importorskip("transformers")
    from seqtrain.checkpoint.hf import hf_state_to_seqtrain

    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        scale_embedding=False,
        activation_function="gelu",
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        dropout=0.0,
    )
    hf = transformers.BartForConditionalGeneration(cfg).eval()
    peaked_init_(hf.named_parameters())
    with torch.no_grad():
        hf.model.shared.weight[EOS] *= 3.0
        hf.final_logits_bias.zero_()
    ours = BARTModel(
        BartConfig(
            vocab_size=V,
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
            dropout=0.0,
        ),
        padding_idx=PAD,
    ).eval()
    ours.load_state_dict(hf_state_to_seqtrain(hf.state_dict(), "hf", []), strict=True)

    srcs = sources(6, seed=11)
    # HF positions count padding, fairseq's do not: right-pad for HF so both see the same positions.
    width = max(map(len, srcs))
    hf_src = torch.tensor([s + [PAD] * (width - len(s)) for s in srcs])
    for beam, lenpen, ngram, min_len, max_len in [(4, 1.0, 0, 1, 12), (3, 2.0, 2, 4, 10), (5, 0.5, 3, 1, 14)]:
        gen = SequenceGenerator(
            ours,
            Dict4(),
            beam_size=beam,
            nbest=1,
            max_len_b=max_len,
            min_len=min_len,
            len_penalty=lenpen,
            no_repeat_ngram_size=ngram,
        )
        mine = [h[0] for h in gen.generate(left_pad(srcs))]
        out = hf.generate(
            input_ids=hf_src,
            attention_mask=hf_src.ne(PAD),
            num_beams=beam,
            length_penalty=lenpen,
            early_stopping=True,
            no_repeat_ngram_size=ngram,
            min_length=min_len + 1,
            max_length=max_len + 2,
            decoder_start_token_id=EOS,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            suppress_tokens=[PAD],
            logits_processor=transformers.LogitsProcessorList([fairseq_forced_eos(max_len + 2, EOS)]),
            do_sample=False,
            num_return_sequences=1,
            output_scores=True,
            return_dict_in_generate=True,
        )
        for i, h in enumerate(mine):
            seq = out.sequences[i].tolist()[1:]  # drop the decoder start token
            seq = seq[: seq.index(EOS) + 1]
            assert h["tokens"].tolist() == seq
            assert float(h["score"]) == pytest.approx(float(out.sequences_scores[i]), abs=1e-4)


# ------------------------------------------------------------------ CUDA (skipped without a GPU)


@pytest.mark.cuda
def test_cuda_matches_cpu_and_sampling_runs_on_device(model):
    srcs = left_pad(sources(6, seed=4))
    cpu = SequenceGenerator(
        model, Dict4(), beam_size=4, nbest=2, max_len_b=12, no_repeat_ngram_size=2
    ).generate(srcs)
    gpu_model = tiny_model().cuda()
    gen = SequenceGenerator(gpu_model, Dict4(), beam_size=4, nbest=2, max_len_b=12, no_repeat_ngram_size=2)
    gpu = gen.generate(srcs.cuda())
    for a, b in zip(cpu, gpu):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        assert [float(h["score"]) for h in a] == pytest.approx([float(h["score"]) for h in b], abs=1e-4)
    runs = []
    for _ in range(2):
        g = torch.Generator(device="cuda").manual_seed(3)
        sampler = SequenceGenerator(
            gpu_model, Dict4(), beam_size=3, max_len_b=8, search_strategy=Sampling(topk=3, generator=g)
        )
        runs.append([[h["tokens"].tolist() for h in hs] for hs in sampler.generate(srcs.cuda())])
    assert runs[0] == runs[1]
