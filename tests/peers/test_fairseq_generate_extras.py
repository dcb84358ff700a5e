"""--score-reference, ensembles (--path a.pt:b.pt) and diverse beam search against fairseq 0.12 on the fairseq-tiny
fixture (the `fairseq` marker; skipped when fairseq's venv or the fixture is absent).

- --score-reference: fairseq-generate's own output lines on the fixture's valid split, line for line.
- Ensembles: the fixture's checkpoint with a copy whose weights are moved by a seeded draw; fairseq's
  SequenceGenerator over both models (its EnsembleModel, incremental decoding per member) against seqtrain-generate
  --path a.pt:b.pt, hypothesis for hypothesis, scores in fp32.
- Diverse beam search, Hamming diversity: fairseq 0.12.2's DiverseBeamSearch. The peer (fairseq 0.12.3, upstream's
  later main) made cumulative diversity its default; its diversity_discount=0, candidate_multiple=2 setting is the
  0.12.2 rule, but its step still indexes a per-batch table by example id and fails with an IndexError once an id
  reaches the batch size. So: fairseq's own class on a batch whose ids are 0..n-1 (where it works), and on every
  batch a small reference step (REFERENCE_STEP below: 0.12.2's rule, no table) inside fairseq's SequenceGenerator,
  which is what seqtrain must equal; on the first batch both must agree, which checks the reference.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import re
import subprocess
from collections import defaultdict

import pytest
import torch

VENV = pathlib.Path(os.environ.get("FAIRSEQ_VENV") or pathlib.Path.home() / ".cache/seqtrain-peers/fairseq")
pytestmark = [
    pytest.mark.fairseq,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV / "bin" / "fairseq-generate").exists(),
        reason=f"fairseq 0.12 not installed at {VENV} (set FAIRSEQ_VENV, or run ../shared/tools/fairseq-peer.sh)",
    ),
]
LN2 = math.log(2)
COMMON = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--gen-subset", "valid"]
COMMON += ["--batch-size", "64", "--cpu"]

# Runs in fairseq's venv: {"bin", "paths", "beam", "batches": [[ids]], "search": "beam" | "fairseq-dbs" |
# "reference-dbs", "groups", "strength"} -> {"hypos": {id: [[tokens], score, [positional]]}} or {"error": ...}.
FAIRSEQ_SIDE = r"""
import json, sys
import torch
from fairseq import checkpoint_utils, search
from fairseq.sequence_generator import SequenceGenerator

REFERENCE_STEP = '''
class HammingDiverseBeamSearch(search.Search):
    # fairseq 0.12.2's DiverseBeamSearch.step: each group's beam step sees, for every token the earlier groups
    # proposed at this step, -strength per proposing candidate; no state across steps
    def __init__(self, tgt_dict, num_groups, strength):
        super().__init__(tgt_dict)
        self.num_groups, self.strength, self.beam = num_groups, strength, search.BeamSearch(tgt_dict)

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        bsz, beam_size, vocab = lprobs.size()
        penalty = torch.zeros(bsz, vocab).to(lprobs)
        out = []
        for g in range(self.num_groups):
            lprobs_g = lprobs[:, g::self.num_groups, :]
            if g > 0:
                lprobs_g = torch.add(lprobs_g, other=penalty.unsqueeze(1), alpha=-self.strength)
            else:
                lprobs_g = lprobs_g.contiguous()
            scores_g = scores[:, g::self.num_groups, :] if step > 0 else None
            s, i, b = self.beam.step(step, lprobs_g, scores_g)
            out.append((s, i, b * self.num_groups + g))
            penalty.scatter_add_(1, i, torch.ones(i.size()).to(penalty))
        return tuple(torch.stack([o[k] for o in out], dim=2).view(bsz, -1) for k in range(3))
'''
exec(REFERENCE_STEP)
job = json.load(sys.stdin)
models, _, task = checkpoint_utils.load_model_ensemble_and_task(job["paths"], arg_overrides={"data": job["bin"]})
for m in models:
    m.eval()
task.load_dataset("valid")
ds, tgt_dict = task.dataset("valid"), task.target_dictionary
if job["search"] == "fairseq-dbs":
    strategy = search.DiverseBeamSearch(tgt_dict, job["groups"], job["strength"], diversity_discount=0.0,
                                        candidate_multiple=2)
elif job["search"] == "reference-dbs":
    strategy = HammingDiverseBeamSearch(tgt_dict, job["groups"], job["strength"])
else:
    strategy = None
gen = SequenceGenerator(models, tgt_dict, beam_size=job["beam"], search_strategy=strategy)
hypos = {}
try:
    for ids in job["batches"]:
        sample = ds.collater([ds[i] for i in ids])
        with torch.no_grad():
            out = gen.generate(models, sample)
        for sid, hs in zip(sample["id"].tolist(), out):
            hypos[sid] = [[h["tokens"].tolist(), float(h["score"]), h["positional_scores"].tolist()] for h in hs]
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
print(json.dumps({"hypos": hypos}))
"""


def peer_env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH"
    }  # fairseq's venv must not import seqtrain
    return dict(env, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1")


def fairseq_generator(job: dict) -> dict:
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", FAIRSEQ_SIDE],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=peer_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def seqtrain_generate(argv: list[str]) -> list[str]:
    from seqtrain.generation.generate import generate
    from seqtrain.generation.options import parse_generation_args

    return generate(parse_generation_args(argv), out=io.StringIO())["lines"]


def parse_lines(lines: list[str]) -> dict[int, list[list]]:
    """{id: [[H text, H score, [P scores]], ...]} from S-/T-/H-/D-/P- lines (scores in base 2)."""
    hyps: dict[int, list[list]] = defaultdict(list)
    for line in lines:
        m = re.match(r"^([HP])-(\d+)\t(.*)$", line)
        if not m:
            continue
        sid, rest = int(m.group(2)), m.group(3)
        if m.group(1) == "H":
            score, _, text = rest.partition("\t")
            hyps[sid].append([text, float(score), None])
        else:
            hyps[sid][-1][2] = [float(x) for x in rest.split()]
    return hyps


@pytest.fixture
def valid_order(fairseq_tiny) -> list[int]:
    """The valid split's ids in fairseq-generate's order (by target, then source length)."""
    from seqtrain.data.dictionary import Dictionary
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain.data.pair_dataset import LanguagePairDataset
    from seqtrain.generation.runner import order_examples

    bin_dir = fairseq_tiny / "data-bin"
    src = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.src"))
    tgt = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.tgt"))
    d = Dictionary.load(str(bin_dir / "dict.src.txt"))
    ds = LanguagePairDataset(src, src.sizes, d, tgt, tgt.sizes, d)
    return order_examples(ds).tolist()


def test_score_reference_lines_equal_fairseq_generates(fairseq_tiny):
    bin_dir, ckpt = fairseq_tiny / "data-bin", fairseq_tiny / "checkpoint_last.pt"
    flags = [str(bin_dir), "--path", str(ckpt), *COMMON, "--score-reference"]
    proc = subprocess.run(
        [str(VENV / "bin" / "fairseq-generate"), *flags],
        capture_output=True,
        text=True,
        env=peer_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = by_example([x for x in proc.stdout.splitlines() if re.match(r"^[STHDP]-\d+\t", x)])
    ours = by_example(seqtrain_generate([*flags, "--unsafe-load"]))
    assert sorted(ours) == sorted(theirs) and len(theirs) == 200
    for sid, want in theirs.items():
        got = ours[sid]
        assert (
            [x.split("\t")[0] for x in got]
            == [x.split("\t")[0] for x in want]
            == [f"{k}-{sid}" for k in "STHDP"]
        )
        for a, b in zip(got, want):
            kind = a[0]
            assert a.split("\t")[-1] == b.split("\t")[-1] or kind == "P", (
                a,
                b,
            )  # the reference's tokens, text
            if kind in "HD":
                assert float(a.split("\t")[1]) == pytest.approx(float(b.split("\t")[1]), abs=1e-5), (a, b)
            if kind == "P":
                pa, pb = (
                    [float(x) for x in a.split("\t")[1].split()],
                    [float(x) for x in b.split("\t")[1].split()],
                )
                assert len(pa) == len(pb) and max(abs(x - y) for x, y in zip(pa, pb)) <= 1e-4 + 1e-9, (a, b)


def by_example(lines: list[str]) -> dict[int, list[str]]:
    """{id: its lines in printed order}."""
    out: dict[int, list[str]] = defaultdict(list)
    for line in lines:
        out[int(line.split("\t")[0].split("-")[1])].append(line)
    return out


@pytest.fixture
def perturbed(fairseq_tiny, tmp_path_factory) -> pathlib.Path:
    """The fixture's checkpoint with every float weight moved by 0.02 x a seeded normal draw."""
    from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file

    base = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"), unsafe=True)
    gen = torch.Generator().manual_seed(7)
    base["model"] = {
        k: v + 0.02 * torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v
        for k, v in base["model"].items()
    }
    path = tmp_path_factory.mktemp("ensemble") / "perturbed.pt"
    save_checkpoint_file(base, str(path))
    return path


def test_ensemble_equals_fairseqs(fairseq_tiny, perturbed, valid_order):
    bin_dir, ckpt = fairseq_tiny / "data-bin", fairseq_tiny / "checkpoint_last.pt"
    batches = [valid_order[k : k + 64] for k in range(0, 200, 64)]
    job = dict(bin=str(bin_dir), paths=[str(ckpt), str(perturbed)], beam=4, batches=batches, search="beam")
    theirs = fairseq_generator(job)["hypos"]
    flags = [str(bin_dir), *COMMON, "--beam", "4", "--nbest", "4", "--unsafe-load"]
    ours = parse_lines(seqtrain_generate([*flags, "--path", f"{ckpt}:{perturbed}"]))
    single = parse_lines(seqtrain_generate([*flags, "--path", str(ckpt)]))
    from seqtrain.data.dictionary import Dictionary

    d = Dictionary.load(str(bin_dir / "dict.tgt.txt"))
    assert len(theirs) == len(ours) == 200
    moved = 0
    for sid, want in theirs.items():
        got = ours[int(sid)]
        assert len(got) == len(want) == 4, sid
        for (text, score, pos), (tokens, t_score, t_pos) in zip(got, want):
            assert text == d.string(torch.tensor(tokens)), sid
            assert score == pytest.approx(t_score / LN2, abs=1e-5), sid
            assert pos == pytest.approx([round(x / LN2, 4) for x in t_pos], abs=1e-4 + 1e-9), sid
        moved += sum(abs(a[1] - b[1]) > 1e-3 for a, b in zip(got, single[int(sid)]))
    assert moved > 100  # the second member changes the scores: this is not the single model again


def test_ensemble_of_one_is_the_model(fairseq_tiny):
    bin_dir, ckpt = fairseq_tiny / "data-bin", fairseq_tiny / "checkpoint_last.pt"
    from seqtrain.generation.runner import split_paths

    assert split_paths(str(ckpt)) == [str(ckpt)]
    flags = [str(bin_dir), "--path", str(ckpt), *COMMON, "--beam", "4", "--unsafe-load"]
    with open(fairseq_tiny / "generate_beam4_valid.log", encoding="utf-8") as f:
        logged = parse_lines(f.read().splitlines())
    ours = parse_lines(
        seqtrain_generate(flags)
    )  # one path: the model itself, as fairseq-generate's log shows
    assert sorted(ours) == sorted(logged)
    for sid, want in logged.items():
        assert [h[0] for h in ours[sid]] == [h[0] for h in want], sid
        assert [h[1] for h in ours[sid]] == pytest.approx([h[1] for h in want], abs=1e-4), sid


@pytest.mark.parametrize("groups, strength", [(2, 0.5), (4, 2.0)])
def test_diverse_beam_search_equals_fairseqs(fairseq_tiny, valid_order, groups, strength):
    from seqtrain.checkpoint.load import load_model
    from seqtrain.data.indexed_dataset import MMapIndexedDataset
    from seqtrain.data.pair_dataset import LanguagePairDataset
    from seqtrain.generation.search import DiverseBeamSearch
    from seqtrain.generation.sequence_generator import SequenceGenerator, generate_batch

    bin_dir, ckpt = fairseq_tiny / "data-bin", fairseq_tiny / "checkpoint_last.pt"
    fitting = list(range(64))  # ids 0..63 in one batch: fairseq's own class works there
    rest = [i for i in valid_order if i >= 64]
    batches = [fitting] + [rest[k : k + 64] for k in range(0, len(rest), 64)]
    job = dict(bin=str(bin_dir), paths=[str(ckpt)], beam=4, groups=groups, strength=strength)
    own = fairseq_generator(dict(job, batches=[fitting], search="fairseq-dbs"))["hypos"]
    crashed = fairseq_generator(dict(job, batches=batches[1:2], search="fairseq-dbs"))
    assert crashed.get("error", "").startswith("IndexError"), (
        crashed
    )  # ids past the batch: fairseq 0.12.3 fails
    reference = fairseq_generator(dict(job, batches=batches, search="reference-dbs"))["hypos"]
    assert len(reference) == 200
    for sid in own:  # the reference step is fairseq's own rule where fairseq's own class runs
        assert [h[0] for h in own[sid]] == [h[0] for h in reference[sid]], sid
        assert [h[1] for h in own[sid]] == [h[1] for h in reference[sid]], sid

    lm = load_model(str(ckpt), dict_path=str(bin_dir / "dict.src.txt"))
    src = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.src"))
    tgt = MMapIndexedDataset(str(bin_dir / "valid.src-tgt.tgt"))
    ds = LanguagePairDataset(src, src.sizes, lm.src_dict, tgt, tgt.sizes, lm.tgt_dict, shuffle=False)
    gen = SequenceGenerator(
        lm.model, lm.tgt_dict, beam_size=4, search_strategy=DiverseBeamSearch(groups, strength)
    )
    ours = {sid: h for b in batches for sid, h in generate_batch(gen, ds.collater([ds[i] for i in b]))}
    for sid, want in reference.items():
        got = ours[int(sid)]
        assert [h["tokens"].tolist() for h in got] == [h[0] for h in want], sid
        assert [float(h["score"]) for h in got] == pytest.approx([h[1] for h in want], abs=1e-5), sid
        for h, w in zip(got, want):
            assert h["positional_scores"].tolist() == pytest.approx(w[2], abs=1e-5), sid
    plain = SequenceGenerator(lm.model, lm.tgt_dict, beam_size=4)
    first = generate_batch(plain, ds.collater([ds[i] for i in fitting]))
    differs = sum(
        [x["tokens"].tolist() for x in h] != [x["tokens"].tolist() for x in ours[sid]] for sid, h in first
    )
    assert differs > 0  # the groups' penalty changes the beams: this is not plain beam search
