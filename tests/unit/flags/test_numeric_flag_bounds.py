"""A generated grid: every numeric flag of every CLI (every int / float / list-of-numbers flag of the parsers,
with each optimizer's and lr scheduler's own flags) given NaN, inf, a negative, zero and a huge value. Each bad
value exits 1 or 2 with one line naming the flag, no traceback, and writes no file. The values that are legal
(a 0 that means "off", a negative length penalty) are listed in LEGAL with the reason; the test checks that
they really parse, so the table cannot go stale."""

from __future__ import annotations

import argparse
import importlib
import os

import pytest

from seqtrain import registry
from seqtrain.config import left_out
from seqtrain.evaluation.report import get_eval_parser
from seqtrain.flags import parsing, tools, training
from seqtrain.generation import options
from seqtrain.preprocess import options as preprocess_options

VALUES = ("nan", "inf", "-5", "0", "1e30")
HUGE_INT = str(10**20)

# (CLI, flag) -> {value: why it is legal}
_ZERO_OFF = {"0": "0 means off / none / unlimited"}
LEGAL: dict[tuple[str, str], dict[str, str]] = {
    **{
        (cli, flag): {"0": reason}
        for cli in ("train", "generate")
        for flag, reason in [
            ("--seed", "seed 0 is a seed like any other"),
            ("--profile", "0 updates profiled: profiling off"),
            ("--num-workers", "0 data-loader workers: load in the main process"),
            ("--distributed-rank", "rank 0 is the first rank"),
            ("--local_rank", "device 0 is the first device"),
            ("--fp16-scale-tolerance", "no tolerance: halve the scale at the first overflow"),
        ]
    },
    ("score", "--seed"): {"0": "seed 0 is a seed like any other"},
    ("score", "--bootstrap"): {"0": "0 resamples: no intervals"},
    ("eval", "--seed"): {"0": "seed 0 is a seed like any other"},
    ("eval", "--bootstrap"): {"0": "0 resamples: no intervals"},
    ("eval", "--examples"): {"0": "no worst / best examples shown"},
    ("generate", "--rerank-lenpen"): {
        "0": "exponent 0: the summed log-probabilities, no length normalisation"
    },
    **{
        ("train", flag): _ZERO_OFF
        for flag in (
            "--clip-norm",
            "--max-epoch",
            "--max-update",
            "--save-interval-updates",
            "--validate-after-updates",
            "--validate-interval-updates",
            "--warmup-updates",
            "--ignore-prefix-size",
            "--merge-max-tokens",
            "--stop-time-hours",
            "--keep-best-checkpoints",
            "--keep-interval-updates",
            "--keep-last-epochs",
            "--patience",
            "--lr-patience",
            "--lr-threshold",
            "--wd",
            "--min-lr",
            "--end-learning-rate",
            "--warmup-init-lr",
            "--stop-min-lr",
            "--dropout",
            "--attention-dropout",
            "--activation-dropout",
            "--relu-dropout",
            "--label-smoothing",
            "--momentum",
            "--beta1",
        )
    },
    ("train", "--decay-rate"): {"0": "Adafactor decay rate 0: beta2 fixed at 0 (no averaging)"},
    ("train", "--ema-decay"): {
        "0": "EMA decay 0: the EMA is a copy of the weights (fairseq's rule before --ema-start-update)"
    },
    ("train", "--ema-start-update"): {"0": "the EMA decays from the first update (the default)"},
    ("train", "--lora-rank"): {"0": "rank 0: no LoRA adapters (the default)"},
    ("train", "--eval-rouge-bootstrap"): {"0": "0 resamples: no intervals (the default)"},
    ("train", "--lora-dropout"): {"0": "no dropout on the adapters' input (the default)"},
    ("train", "--distill-alpha"): {"0": "alpha 0: the label-smoothed loss alone, the teacher unused"},
    **{
        ("generate", flag): _ZERO_OFF
        for flag in ("--max-len-a", "--max-len-b", "--no-repeat-ngram-size", "--prefix-size")
    },
    ("train", "--lr"): {"0": "lr 0 keeps the weights as loaded (used to check loading and resuming)"},
    ("generate", "--lenpen"): {
        "0": "lenpen 0: scores are plain sums of log-probabilities",
        "-5": "a negative lenpen favours short outputs (fairseq allows it)",
    },
    ("generate", "--unkpen"): {
        "0": "no unknown-word penalty (the default)",
        "-5": "a negative penalty favours <unk> (fairseq allows it)",
    },
    ("generate", "--min-len"): {"0": "no minimum length"},
    ("generate", "--diverse-beam-strength"): {
        "0": "strength 0: the groups search independently",
        "-5": "a negative strength pulls the groups together (fairseq allows it)",
    },
    ("generate", "--shard-id"): {"0": "the first shard"},
    **{
        ("preprocess", flag): _ZERO_OFF
        for flag in ("--thresholdsrc", "--thresholdtgt", "--spm-input-sentence-size")
    },
}


# flags of shared groups that seqtrain-generate leaves out (refused by name before any value is read)
GENERATE_LEFT_OUT = set(left_out(options.get_generation_parser()))


def _numeric(action: argparse.Action) -> bool:
    if not action.option_strings or action.type is None:
        return False
    name = getattr(action.type, "__name__", "")
    return action.type in (int, float) or name in ("int_list", "_lr_arg")


def _grid() -> list[tuple[str, str, tuple[str, ...]]]:
    """(cli, flag, component flags that make it exist), one per numeric flag."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}

    def scan(parser: argparse.ArgumentParser, cli: str, extra: tuple[str, ...] = ()) -> None:
        for a in parser._actions:
            if cli == "generate" and a.option_strings and a.option_strings[-1] in GENERATE_LEFT_OUT:
                continue  # refused by name before any value is read (tests/e2e/test_generate_output.py)
            if _numeric(a):
                found.setdefault((cli, a.option_strings[-1]), extra)

    train = training.get_training_parser()
    parsing.add_choice_args(train, "task", "translation")
    scan(train, "train")
    import seqtrain.tasks  # noqa: F401

    for kind, table in (("optimizer", registry.OPTIMIZERS), ("lr_scheduler", registry.LR_SCHEDULERS)):
        for name in table.names():
            p = training.get_training_parser()
            parsing.add_choice_args(p, kind, name)
            scan(p, "train", (f"--{kind.replace('_', '-')}", name))
    gen = options.get_generation_parser()
    parsing.add_choice_args(gen, "task", "translation")
    scan(gen, "generate")
    scan(preprocess_options.get_preprocessing_parser(), "preprocess")
    scan(tools.get_convert_parser(), "convert")
    scan(tools.get_score_parser(), "score")
    scan(get_eval_parser(), "eval")
    return [(cli, flag, extra) for (cli, flag), extra in sorted(found.items())]


GRID = _grid()
# seqtrain-convert's generation_config.json flags take what seqtrain-generate's take
for _flag in ("--beam", "--lenpen", "--max-len-b", "--min-len", "--no-repeat-ngram-size"):
    if ("generate", _flag) in LEGAL:
        LEGAL[("convert", _flag)] = LEGAL[("generate", _flag)]
# training-only flags that seqtrain-generate refuses by name have no values to check there
LEGAL = {k: v for k, v in LEGAL.items() if not (k[0] == "generate" and k[1] in GENERATE_LEFT_OUT)}


def _argv(cli: str, flag: str, value: str, extra: tuple[str, ...], root: str) -> list[str]:
    base = {
        "train": [f"{root}/bin", "--arch", "bart_tiny", "--cpu", "--save-dir", f"{root}/save"],
        "generate": [f"{root}/bin", "--path", f"{root}/model.pt", "--cpu", "--results-path", f"{root}/res"],
        "preprocess": ["-s", "a", "-t", "b", "--trainpref", f"{root}/raw", "--destdir", f"{root}/bin"],
        "convert": [f"{root}/in.pt", f"{root}/out.pt", "--to", "hf"],
        "score": ["--sys", f"{root}/sys", "--ref", f"{root}/ref"],
        "eval": ["--hyps", f"{root}/sys", "--source", f"{root}/src", "--reference", f"{root}/ref"],
    }[cli]
    return base + list(extra) + [f"{flag}={value}"]


def test_grid_covers_every_cli_with_numeric_flags():
    clis = {cli for cli, _, _ in GRID}
    assert {"train", "generate", "preprocess"} <= clis
    assert len(GRID) >= 100, len(GRID)
    flags = {(cli, flag) for cli, flag, _ in GRID}
    assert set(LEGAL) <= flags, set(LEGAL) - flags


def test_legal_values_parse(tmp_path):
    """Every LEGAL entry is really accepted by the parser (the table holds no stale exemptions)."""
    extras = {(cli, flag): extra for cli, flag, extra in GRID}
    for (cli, flag), values in LEGAL.items():
        for value in values:
            argv = _argv(cli, flag, value, extras[(cli, flag)], str(tmp_path))
            if cli == "train":
                training.parse_train_args(argv)
            elif cli == "generate":
                options.parse_generation_args(argv)
            elif cli == "score":
                tools.get_score_parser().parse_args(argv)
            elif cli == "eval":
                get_eval_parser().parse_args(argv)
            elif cli == "convert":
                tools.get_convert_parser().parse_args(argv)
            else:
                preprocess_options.get_preprocessing_parser().parse_args(argv)


@pytest.mark.parametrize("cli,flag,extra", GRID, ids=[f"{c}{f}" for c, f, _ in GRID])
def test_bad_numeric_value_gives_one_line(cli, flag, extra, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"seqtrain_cli.{cli}").cli_main
    legal = LEGAL.get((cli, flag), {})
    for value in VALUES:
        if value in legal:
            continue
        is_int = any(
            a.option_strings and a.option_strings[-1] == flag and a.type is int for a in _parsers_of(cli)
        )
        given = HUGE_INT if (value == "1e30" and is_int) else value
        with pytest.raises(SystemExit) as e:
            main(_argv(cli, flag, given, extra, str(tmp_path)))
        err = capsys.readouterr().err
        lines = [ln for ln in err.strip().splitlines() if ln]
        assert e.value.code in (1, 2), (flag, given, err)
        assert "Traceback" not in err and len(lines) == 1, (flag, given, err)
        assert lines[0].startswith(f"seqtrain-{cli}: error: ") and flag in lines[0], lines[0]
        written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
        assert written == [], (flag, given, written)


_PARSERS: dict[str, list[argparse.Action]] = {}


def _parsers_of(cli: str) -> list[argparse.Action]:
    if cli not in _PARSERS:
        actions: list[argparse.Action] = []
        if cli == "train":
            for kind, table in (("optimizer", registry.OPTIMIZERS), ("lr_scheduler", registry.LR_SCHEDULERS)):
                for name in table.names():
                    p = training.get_training_parser()
                    parsing.add_choice_args(p, kind, name)
                    actions += p._actions
        elif cli == "generate":
            p = options.get_generation_parser()
            parsing.add_choice_args(p, "task", "translation")
            actions = p._actions
        else:
            actions = preprocess_options.get_preprocessing_parser()._actions
        _PARSERS[cli] = actions
    return _PARSERS[cli]
