"""Diverse beam search, ensembles of checkpoints and --score-reference on small random models: each against a
plain computation written here (fairseq itself: tests/peers/test_fairseq_generate_extras.py)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from seqtrain.config import add_settings
from seqtrain.errors import SeqtrainError
from seqtrain.generation.ensemble import EnsembleModel
from seqtrain.generation.runner import split_paths
from seqtrain.generation.scorer import SequenceScorer
from seqtrain.generation.search import (
    DiverseBeamSearch,
    GenerationConfig,
    check_generation_args,
    generation_config,
)
from seqtrain.generation.sequence_generator import SequenceGenerator, build_generator
from tests.unit.generation.reference_beam_search import reference_beam_search
from tests.unit.generation.test_sequence_generator import EOS, PAD, Dict4, left_pad, sources, tiny_model


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=0), tiny_model(seed=1)


def gen_args(**kw) -> GenerationConfig:
    """The search settings: the flags' defaults (fairseq's), then `kw`."""
    parser = argparse.ArgumentParser()
    add_settings(parser, GenerationConfig)
    args = parser.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return generation_config(args)


# ------------------------------------------------------------------ diverse beam search


def test_diverse_step_penalizes_earlier_groups_tokens():
    """Two groups of one hypothesis each: group 1 pays `strength` for each of the 2 tokens group 0 proposed."""
    lprobs = torch.log_softmax(
        torch.tensor([[[3.0, 2.0, 1.0, 0.0, -1.0], [3.0, 2.0, 1.0, 0.0, -1.0]]]), dim=-1
    )
    prev = torch.tensor([[-1.0, -2.0]])
    scores, tokens, beams = DiverseBeamSearch(2, 10.0).step(1, lprobs, prev)
    # interleaved: group 0's best, group 1's best, group 0's second, group 1's second
    assert tokens.tolist() == [[0, 2, 1, 3]]
    assert beams.tolist() == [[0, 1, 0, 1]]
    want = [prev[0, 0] + lprobs[0, 0, 0], prev[0, 1] + lprobs[0, 1, 2], prev[0, 0] + lprobs[0, 0, 1]]
    assert scores[0, :3].tolist() == pytest.approx([float(x) for x in want])


def test_one_group_is_beam_search(models):
    src = left_pad(sources(5, seed=3))
    # both on the eager step, whose candidate step every strategy shares (log_probs, then the strategy's topk):
    # the compiled CPU step gives the same candidates with scores to rounding (test_cpu_step.py)
    plain = SequenceGenerator(models[0], Dict4(), beam_size=4, max_len_b=12, cpu_step=False).generate(src)
    one = SequenceGenerator(
        models[0],
        Dict4(),
        beam_size=4,
        max_len_b=12,
        search_strategy=DiverseBeamSearch(1, 0.5),
        cpu_step=False,
    ).generate(src)
    for a, b in zip(plain, one):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        assert [float(h["score"]) for h in a] == [float(h["score"]) for h in b]


def test_a_strong_penalty_gives_every_group_its_own_first_token(models):
    src = left_pad(sources(6, seed=4))
    strong = SequenceGenerator(
        models[0], Dict4(), beam_size=4, nbest=4, max_len_b=10, search_strategy=DiverseBeamSearch(4, 100.0)
    ).generate(src)
    for hypos in strong:
        firsts = [h["tokens"][0].item() for h in hypos if h["positional_scores"][0] > -50]
        assert len(firsts) == len(set(firsts))  # unpenalized first tokens are all different


def test_diverse_flags_checked():
    with pytest.raises(SeqtrainError, match=r"--beam 5 must be a multiple of --diverse-beam-groups 2"):
        check_generation_args(gen_args(beam=5, diverse_beam_groups=2))
    with pytest.raises(SeqtrainError, match=r"--diverse-beam-groups and --sampling cannot be used together"):
        check_generation_args(gen_args(beam=4, nbest=4, diverse_beam_groups=2, sampling=True))
    gen = build_generator(
        tiny_model(), Dict4(), gen_args(beam=4, diverse_beam_groups=2, diverse_beam_strength=1.5)
    )
    assert isinstance(gen.search, DiverseBeamSearch) and gen.search.strength == 1.5


# ------------------------------------------------------------------ ensembles


class _Averaged(torch.nn.Module):
    """The reference's view of an ensemble: a full forward pass of every member, probabilities averaged."""

    def __init__(self, members):
        super().__init__()
        self.members = torch.nn.ModuleList(members)

    def forward(self, src, lengths, prev):
        probs = torch.stack([F.softmax(m(src, lengths, prev)[0].float(), dim=-1) for m in self.members])
        return probs.mean(dim=0).log(), None

    def max_positions(self):
        return self.members[0].max_positions()


def test_ensemble_matches_reference(models):
    srcs = sources(4, seed=5)
    ens = EnsembleModel(list(models))
    fast = SequenceGenerator(ens, Dict4(), beam_size=3, nbest=3, max_len_b=12).generate(left_pad(srcs))
    averaged = _Averaged(models).eval()
    single = SequenceGenerator(models[0], Dict4(), beam_size=3, nbest=3, max_len_b=12).generate(
        left_pad(srcs)
    )
    assert any(float(a[0]["score"]) != float(b[0]["score"]) for a, b in zip(fast, single))
    for src, hypos in zip(srcs, fast):
        ref = reference_beam_search(averaged, src, 3, max_len_b=12, nbest=3)
        for h, r in zip(hypos, ref):
            assert h["tokens"].tolist() == r["tokens"]
            assert float(h["score"]) == pytest.approx(r["score"], abs=1e-5)
            assert h["positional_scores"].tolist() == pytest.approx(r["positional_scores"], abs=1e-5)


def test_ensemble_of_one_model_twice_is_the_model(models):
    src = left_pad(sources(4, seed=6))
    kw = dict(beam_size=4, nbest=2, max_len_b=10, temperature=0.7)
    alone = SequenceGenerator(models[0], Dict4(), **kw).generate(src)
    twice = SequenceGenerator(EnsembleModel([models[0], models[0]]), Dict4(), **kw).generate(src)
    for a, b in zip(alone, twice):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        assert [float(h["score"]) for h in a] == pytest.approx([float(h["score"]) for h in b], abs=1e-5)


def test_ensembles_decode_eagerly(models):
    """The static step is one model's decoder: an ensemble decodes with the eager loop by default, and asking
    for --static-decoding with one is an error naming both."""
    ens = EnsembleModel(list(models))
    assert not build_generator(ens, Dict4(), gen_args(beam=2)).static_decoding
    assert build_generator(models[0], Dict4(), gen_args(beam=2, static_decoding=True)).static_decoding
    with pytest.raises(SeqtrainError, match=r"--static-decoding decodes one model; an ensemble"):
        build_generator(ens, Dict4(), gen_args(beam=2, static_decoding=True))


def test_split_paths(tmp_path):
    odd = tmp_path / "a:b.pt"
    odd.write_bytes(b"")
    assert split_paths("a.pt:b.pt") == ["a.pt", "b.pt"]
    assert split_paths(str(odd)) == [str(odd)]  # an existing file named with a ':' is one checkpoint
    with pytest.raises(SeqtrainError, match="--path a.pt::b.pt: an empty checkpoint name"):
        split_paths("a.pt::b.pt")


# ------------------------------------------------------------------ --score-reference


def _sample(srcs, tgts):
    width = max(map(len, tgts))
    target = torch.tensor([t + [PAD] * (width - len(t)) for t in tgts])
    prev = torch.tensor([[EOS] + t[:-1] + [PAD] * (width - len(t)) for t in tgts])
    src = left_pad(srcs)
    return {
        "id": torch.arange(len(srcs)),
        "net_input": {"src_tokens": src, "src_lengths": src.ne(PAD).sum(1), "prev_output_tokens": prev},
        "target": target,
    }


def test_score_reference_equals_forced_decoding(models):
    """A reference scored by one forward pass = the same tokens forced one step at a time by the generator."""
    srcs, tgts = sources(3, seed=7), [t[:-1][::-1] + [EOS] for t in sources(3, seed=8)]
    scored = SequenceScorer(models[0], Dict4()).score_batch(_sample(srcs, tgts))
    for (_, [h]), src, tgt in zip(scored, srcs, tgts):
        gen = SequenceGenerator(models[0], Dict4(), beam_size=1, max_len_b=len(tgt), min_len=0)
        forced = gen.generate(left_pad([src]), prefix_tokens=torch.tensor([tgt]))[0][0]
        assert h["tokens"].tolist() == tgt == forced["tokens"].tolist()
        assert h["positional_scores"].tolist() == pytest.approx(
            forced["positional_scores"].tolist(), abs=1e-5
        )
        assert float(h["score"]) == pytest.approx(float(h["positional_scores"].sum()) / len(tgt), abs=1e-6)


def test_score_reference_ensemble_averages_probabilities(models):
    srcs, tgts = sources(2, seed=9), [[5, 6, 7, EOS], [8, EOS]]
    sample = _sample(srcs, tgts)
    ens = SequenceScorer(EnsembleModel(list(models)), Dict4()).score_batch(sample)
    each = [SequenceScorer(m, Dict4()).score_batch(sample) for m in models]
    for row, (_, [h]) in enumerate(ens):
        mean = (
            each[0][row][1][0]["positional_scores"].exp() + each[1][row][1][0]["positional_scores"].exp()
        ) / 2
        assert h["positional_scores"].tolist() == pytest.approx(mean.log().tolist(), abs=1e-5)
    with pytest.raises(SeqtrainError, match="--score-reference: the split has no target side"):
        SequenceScorer(models[0], Dict4()).score_batch(dict(sample, target=None))
    assert math.isfinite(float(ens[0][1][0]["score"]))
