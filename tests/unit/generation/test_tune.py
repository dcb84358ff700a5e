"""seqtrain-tune (seqtrain.generation.tune): the grid syntax and its errors, the search's choice (the argmax of
everything it scored, each score what seqtrain-generate gets with those settings on the same examples), and one
encoder pass per batch whatever the number of settings tried. On fairseq's tiny checkpoint (tests/conftest.py)."""

from __future__ import annotations

import io
import json
import math

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.flags.parsers import UsageError
from seqtrain.generation import tune as tune_mod
from seqtrain.generation import tune_flags
from seqtrain_cli.generate import generate_main
from seqtrain_cli.tune import main as tune_main


def _argv(fairseq_tiny, out, *extra):
    return [
        str(fairseq_tiny / "data-bin"),
        "--path",
        str(fairseq_tiny / "checkpoint_last.pt"),
        "--cpu",
        "-s",
        "src",
        "-t",
        "tgt",
        "--tune-output",
        str(out),
        "--tune-bootstrap",
        "100",
        *extra,
    ]


# ---------------------------------------------------------------------- the grid and its errors


def test_grid_syntax():
    grid = tune_flags._grid(" lenpen=0.6, 1.0,2 ; beam=2,4,4;")
    assert grid == {"lenpen": [0.6, 1.0, 2.0], "beam": [2, 4]}
    assert all(isinstance(v, float) for v in grid["lenpen"]) and all(type(v) is int for v in grid["beam"])
    assert tune_flags._settings("beam,min-len") == ["beam", "min-len"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--tune-grid", "lenpen0.6"], ["--tune-grid", "'lenpen0.6' is not SETTING=V1,V2"]),
        (["--tune-grid", "lenpen="], ["--tune-grid", "is not SETTING=V1,V2"]),
        (["--tune-grid", "temperature=1,2"], ["--tune-grid", "unknown setting 'temperature'"]),
        (["--tune-grid", "beam=2,x"], ["--tune-grid", "beam='x': must be an integer"]),
        (["--tune-grid", "beam=0,4"], ["--tune-grid", "beam=0", "--beam"]),
        (["--tune-grid", "no-repeat-ngram-size=-1"], ["--tune-grid", "no-repeat-ngram-size=-1"]),
        (["--tune-grid", "lenpen=nan"], ["--tune-grid", "lenpen=nan"]),
        (["--tune-grid", "beam=2;beam=4"], ["--tune-grid", "beam is given twice"]),
        (["--tune", "beam,length"], ["--tune", "unknown setting 'length'"]),
        (["--tune-metric", "bleu"], ["--tune-metric", "bleu"]),
        (["--tune-subset", "0"], ["--tune-subset", "0"]),
        (["--tune-bootstrap", "0"], ["--tune-bootstrap", "0"]),
        (["--tune", "beam", "--tune-grid", "lenpen=1,2"], ["--tune-grid", "lenpen", "--tune beam"]),
        (["--results-path", "x"], ["--results-path", "does nothing in seqtrain-tune"]),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(fairseq_tiny, tmp_path, flags, words):
    with pytest.raises(SeqtrainError) as e:
        tune_main(_argv(fairseq_tiny, tmp_path / "t", *flags), out=io.StringIO())
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert not (tmp_path / "t" / "tune.json").exists()
    if len(flags) == 2:
        assert isinstance(e.value, UsageError)  # found while parsing: exit 2, as argparse's errors


def test_input_without_references_is_refused_before_loading(tmp_path):
    with pytest.raises(SeqtrainError, match=r"^--input: give --reference FILE too"):
        tune_main(
            ["--path", str(tmp_path / "absent.pt"), "--input", "-", "--tune-output", str(tmp_path / "t")]
        )


# ---------------------------------------------------------------------- the search


def _table(settings):
    """A made-up score with one best point and ties elsewhere."""
    b, lp = settings["beam"], settings["lenpen"]
    return -((b - 4) ** 2) - 10 * (lp - 1.5) ** 2 if (b, lp) != (2, 0.6) else -20.0


@pytest.mark.parametrize("strategy", ["grid", "coordinate"])
def test_search_returns_the_argmax_of_what_it_scored(strategy):
    cands = {"beam": [1, 2, 4, 8], "lenpen": [0.6, 1.0, 1.5, 2.0]}
    scored = []

    def evaluate(s):
        scored.append(dict(s))
        return None if s["beam"] == 8 and s["lenpen"] == 2.0 else _table(s)

    best = tune_mod.search(cands, {"beam": 2, "lenpen": 0.6, "min_len": 3}, evaluate, strategy)
    assert best == {"beam": 4, "lenpen": 1.5, "min_len": 3}
    assert scored[0] == {"beam": 2, "lenpen": 0.6, "min_len": 3}  # the given settings first
    if strategy == "grid":
        assert len(scored) == 1 + 16
    else:  # one setting at a time: far fewer than the grid
        assert len({tuple(sorted(s.items())) for s in scored}) < 16


def test_ties_keep_the_given_settings():
    best = tune_mod.search({"beam": [1, 2, 3]}, {"beam": 3}, lambda s: 1.0, "grid")
    assert best == {"beam": 3}
    best = tune_mod.search({"beam": [1, 2, 3]}, {"beam": 3}, lambda s: 1.0 + (s["beam"] < 3), "coordinate")
    assert best == {"beam": 1}  # the first of the tied best


# ---------------------------------------------------------------------- on the model


def test_choice_is_the_argmax_and_each_score_is_seqtrain_generates(fairseq_tiny, tmp_path):
    # fairseq-tiny's valid text (the data-bin's dictionaries; no tokenizer: words are tokens)
    src, ref = str(fairseq_tiny / "raw" / "valid.src"), str(fairseq_tiny / "raw" / "valid.tgt")
    grid = "max-len-b=3,4,5;min-len=0,6;beam=1,2"
    out = io.StringIO()
    result = tune_main(
        _argv(fairseq_tiny, tmp_path / "t", "--input", src, "--reference", ref, "--batch-size", "8")
        + [
            "--tune",
            "max-len-b,min-len,beam",
            "--tune-grid",
            grid,
            "--tune-subset",
            "24",
            "--tune-search",
            "grid",
        ]
        + ["--max-len-b", "3", "--beam", "4"],
        out=out,
    )
    trials = result["trials"]
    metric = result["metric"]
    # beam 1,2,4 x min-len 0,1,6 x max-len-b 3,4,5 (the given values join the grid): 27, of which the 9 with
    # min-len 6 above max-len-b are not tried (seqtrain-generate refuses them)
    assert result["candidates"] == {"max-len-b": [3, 4, 5], "min-len": [0, 1, 6], "beam": [1, 2, 4]}
    assert metric == "rougeLsum" and len(trials) == 18 and len(result["not_tried"]) == 9
    values = [t["rouge"][metric] for t in trials]
    assert len(set(values)) == 3  # the settings matter here: the best is not the given
    best = max(trials, key=lambda t: t["rouge"][metric])  # the first of the best, as the search keeps
    assert result["best"] == best["settings"] and best["settings"] != result["given"]
    # each score is what seqtrain-generate gets with those settings on the same examples
    ids = result["subset"]["ids"]
    assert len(ids) == 24 and ids == sorted(set(ids))
    lines_src = open(src).read().split("\n")
    lines_ref = open(ref).read().split("\n")
    (tmp_path / "s.src").write_text("".join(lines_src[i] + "\n" for i in ids))
    (tmp_path / "s.tgt").write_text("".join(lines_ref[i] + "\n" for i in ids))
    for t in trials[:: max(1, len(trials) // 6)] + [best]:
        s = t["settings"]
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in s.items()]
        got = generate_main(
            [str(fairseq_tiny / "data-bin"), "--path", str(fairseq_tiny / "checkpoint_last.pt"), "--cpu"]
            + [
                "-s",
                "src",
                "-t",
                "tgt",
                "--input",
                str(tmp_path / "s.src"),
                "--reference",
                str(tmp_path / "s.tgt"),
            ]
            + ["--scoring", "rouge", "--batch-size", "5", *flags],
            out=io.StringIO(),
        )
        for k in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
            assert math.isclose(got["rouge"][k], t["rouge"][k], abs_tol=1e-9), (s, k)
    # the whole split: the given and the best, with intervals around their means, and the gain between them
    full = result["full"]
    assert full["n"] == 200
    for side in ("given", "best"):
        lo, hi = full[side]["interval"][metric]
        assert lo <= full[side]["rouge"][metric] <= hi
    assert full["gain"][metric] == pytest.approx(
        full["best"]["rouge"][metric] - full["given"]["rouge"][metric]
    )
    assert full["gain"][metric] > 0 and full["paired_test"][metric]["p_value"] < 0.05
    assert f"{full['gain'][metric]:+.2f}" in out.getvalue()
    written = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert written["best"] == result["best"] and written["full"]["gain"] == full["gain"]


def test_the_encoder_runs_once_per_batch(fairseq_tiny, tmp_path, monkeypatch):
    """However many settings are tried, the sample's batches are encoded once (their outputs cached), and the
    whole split's once for the given and the best settings together."""
    from seqtrain.models import bart

    calls = []
    forward = bart.BartEncoder.forward
    monkeypatch.setenv("SEQTRAIN_CPU_STEP", "eager")  # the model's own encoder, whose passes are counted

    def counting(self, *a, **k):
        calls.append(a[0].shape[0])
        return forward(self, *a, **k)

    monkeypatch.setattr(bart.BartEncoder, "forward", counting)
    result = tune_main(
        _argv(fairseq_tiny, tmp_path / "t", "--batch-size", "10", "--tune-subset", "30")
        + ["--tune", "max-len-b,lenpen", "--tune-grid", "max-len-b=3,4,6;lenpen=0.5,1,2", "--max-len-b", "3"],
        out=io.StringIO(),
    )
    assert len(result["trials"]) >= 5 and result["best"] != result["given"]
    assert result["encoder_passes"] == {"subset": 3, "full": 20}  # 30 / 10 and 200 / 10 batches
    assert len(calls) == 3 + 20 and sum(calls) == 30 + 200
    calls.clear()  # a sample of the whole split: its cached batches serve the comparison too
    result = tune_main(
        _argv(fairseq_tiny, tmp_path / "t", "--batch-size", "50", "--tune-subset", "500")
        + ["--tune", "max-len-b", "--tune-grid", "max-len-b=3,6", "--max-len-b", "3"],
        out=io.StringIO(),
    )
    assert result["subset"]["n"] == 200 and result["best"]["max_len_b"] == 6
    assert result["encoder_passes"] == {"subset": 4, "full": 0} and len(calls) == 4
    assert result["full"]["best"]["rouge"] == result["trials"][-1]["rouge"]


def test_combinations_the_model_cannot_run_are_not_tried():
    """Issue 48: a grid candidate wider than the vocabulary allows, or --rerank over one hypothesis, is "not
    tried" with seqtrain-generate's reason, as other combinations it would refuse are."""
    from seqtrain.config import from_args
    from seqtrain.generation.options import parse_generation_args
    from seqtrain.generation.program import GenerateConfig

    cfg = from_args(GenerateConfig, parse_generation_args(["--path", "ck.pt", "--rerank", "mbr"]))
    assert tune_mod.valid_combination(cfg, {"beam": 39}, 1024, vocab=40) is None
    assert tune_mod.valid_combination(cfg, {"beam": 40}, 1024, vocab=40).startswith(
        "--beam 40 is wider than the model's vocabulary allows: beam search keeps at most 39 hypotheses"
    )
    assert tune_mod.valid_combination(cfg, {"beam": 1}, 1024, vocab=40).startswith(
        "--rerank mbr chooses among the beam's finished hypotheses, and --beam 1 leaves one"
    )
