"""--config read with PyYAML (sections flattened to flag names), --print-config writes a config that reproduces the
resolved flags, and every training run saves it as SAVE_DIR/config.yaml."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from seqtrain.config import from_args
from seqtrain.data.options import TrainDatasetConfig, check_dataset_args
from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, tools, training
from seqtrain.generation import options
from seqtrain.preprocess import options as preprocess_options
from tests.utils import REPO, base_args


def parse(*argv: str):
    # as seqtrain-train: a preset's generation keys are seqtrain-generate's, skipped
    return training.parse_train_args(list(argv), options.generation_flags)


def printed(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse(*argv, "--print-config")
    assert e.value.code == 0
    return capsys.readouterr().out


def comparable(args) -> dict:
    out = dict(vars(args))
    out.pop("config", None)
    return out


SECTIONS = """\
model:
  arch: bart_tiny
  encoder-layers: 3
optimization:
  lr: 5e-4          # a comment after a value
  update_freq: [2, 1]
  lr-scheduler: inverse_sqrt
  warmup-updates: 40
checkpoint:
  no-epoch-checkpoints: yes
  optimizer-overrides: {lr: 0.0001}
valid-subset: "valid,test"
"""


def test_sections_are_flattened_to_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SECTIONS)
    args = parse("data", "--config", str(cfg))
    assert (args.arch, args.encoder_layers, args.lr, args.update_freq) == ("bart_tiny", 3, [5e-4], [2, 1])
    assert (args.lr_scheduler, args.warmup_updates, args.no_epoch_checkpoints) == ("inverse_sqrt", 40, True)
    assert args.optimizer_overrides == '{"lr": 0.0001}'  # a JSON-valued flag keeps its mapping
    assert args.valid_subset == "valid,test"
    assert parse("data", "--config", str(cfg), "--lr", "1e-3").lr == [1e-3]  # the command line wins


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "model:\n  arch: bart_tiny\n  encoder-layrs: 3\n",
            r"c.yaml line 3 \(encoder-layrs\): unknown option "
            r"'encoder-layrs'; did you mean 'encoder-layers'\?",
        ),
        ("arch: bart_tiny\nmax-tokens: [1\n", r"c.yaml line 3: invalid YAML"),
        ("arch: bart_tiny\na:\n  lr: 1\nb:\n  lr: 2\n", r"c.yaml line 5: 'lr' is given twice"),
        ("- arch\n- bart_tiny\n", r"c.yaml: expected a mapping of flag names"),
        ("arch: bart_tiny\nmax-update: many\n", r"line 2 \(max-update\): invalid value 'many'"),
    ],
)
def test_config_errors_name_file_and_line(tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(SeqtrainError, match=message):
        parse("data", "--config", str(cfg))


@pytest.mark.parametrize(
    "text,message",
    [
        # issue 48, class 9: a mapping under a flag's name was read as a section: `beam: {a: 1}` set --arch 1
        # (fairseq's -a) and lost the beam; the same for a training flag in a generation config and back
        (
            "beam: {a: 1}\n",
            r"c.yaml line 1 \(beam\): 'beam' is a flag, and its value is a mapping; give the flag",
        ),
        ("model:\n  lr:\n    a: 3\n", r"c.yaml line 2 \(lr\): 'lr' is a flag, and its value is a mapping"),
        ('{"--max-epoch": {"x": 1}}', r"c.yaml \(--max-epoch\): '--max-epoch' is a flag, and its value is a"),
        # training's keys pass through a generation config (one preset serves both), but not unknown components
        (
            "arch: no_such_arch\n",
            r"c.yaml line 1 \(arch\): unknown arch 'no_such_arch'; choose from: bart_base",
        ),
        ("lr: 0.1\na: no_such_arch\n", r"c.yaml line 2 \(a\): unknown arch 'no_such_arch'; choose from"),
        (
            "optimizer: lion\n",
            r"c.yaml line 1 \(optimizer\): unknown optimizer 'lion'; choose from: adafactor",
        ),
        ("lr-scheduler: cosinez\n", r"line 1 \(lr-scheduler\): unknown lr scheduler 'cosinez'; choose from"),
    ],
)
@pytest.mark.parametrize("program", ["train", "generate"])
def test_a_flag_is_no_section_and_components_are_known_in_every_program(tmp_path, program, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(SeqtrainError, match=message):
        if program == "train":
            parse("data", "--config", str(cfg))
        else:
            options.parse_generation_args(["--path", "ck.pt", "--config", str(cfg)])
    # sections under other names, also `a` (no long flag), keep working; training keys pass through generation
    cfg.write_text("a:\n  arch: bart_tiny\ngeneration:\n  beam: 3\n  lenpen: 0.5\noptimization: {lr: 0.1}\n")
    assert (parse("data", "--config", str(cfg)).arch, parse("data", "--config", str(cfg)).lr) == (
        "bart_tiny",
        [0.1],
    )
    args = options.parse_generation_args(["--path", "ck.pt", "--config", str(cfg)])
    assert (args.beam, args.lenpen) == (3, 0.5)


def test_non_utf8_config_is_one_line_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"arch: bart_\xff\n")
    with pytest.raises(SeqtrainError, match="c.yaml: not UTF-8 text"):
        parse("data", "--config", str(cfg))


@pytest.mark.parametrize(
    "argv",
    [
        ("data", "--arch", "bart_tiny"),
        (
            "data",
            "--config",
            os.path.join(REPO, "configs", "bart_large_cnndm.yaml"),
            "--lr",
            "1e-5",
            "--no-fp16",
            "--max-tokens",
            "1024",
            "--restore-file",
            "bart.large/model.pt",
        ),
        (
            "data",
            "--config",
            os.path.join(REPO, "configs", "debdesc_small.yaml"),
            "--dropout",
            "0.3",
            "--adam-betas",
            "(0.9, 0.98)",
            "--update-freq",
            "2,4",
        ),
    ],
)
def test_print_config_reproduces_the_resolved_flags(tmp_path, capsys, argv):
    text = printed(capsys, *argv)
    assert text.startswith("# The resolved flags") and "print-config" not in text
    assert yaml.safe_load(text)["data"] == "data"
    saved = tmp_path / "resolved.yaml"
    saved.write_text(text)
    again = parse("--config", str(saved))  # the printed file alone
    assert comparable(again) == comparable(parse(*argv))
    # printing the printed config gives the same values (a fixed point)
    assert yaml.safe_load(printed(capsys, "--config", str(saved))) == yaml.safe_load(text)


@pytest.mark.slow
def test_run_saves_its_config(databin, tmp_path):
    save = str(tmp_path / "ck")
    argv = base_args(databin, save, "--max-update", "2", "--no-epoch-checkpoints")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "seqtrain_cli.train", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    saved, given = parse("--config", os.path.join(save, "config.yaml")), parse(*argv)
    data = check_dataset_args(from_args(TrainDatasetConfig, given))  # what the run resolved before saving
    given.max_tokens_valid, given.batch_size_valid = data.max_tokens_valid, data.batch_size_valid
    assert comparable(saved) == comparable(given)
    assert not [n for n in os.listdir(save) if n.startswith(".")]


def test_every_switch_has_a_negative_form(tmp_path):
    """A config's true is turned off on the command line: --no-X (for a flag named --no-X: --X)."""
    import argparse

    train = training.get_training_parser()
    parsing.parse_args_and_arch(train, ["data", "--arch", "bart_tiny"])  # adds the component flags
    gen = options.get_generation_parser()
    parsing.parse_args_and_arch(gen, ["data", "--path", "x.pt"])
    built = [
        train,
        gen,
        preprocess_options.get_preprocessing_parser(),
        tools.get_convert_parser(),
        tools.get_score_parser(),
    ]
    for parser in built:
        for action in parser._actions:
            if isinstance(action, argparse._StoreTrueAction):
                assert getattr(action, "negatives", ()), action.option_strings
    cfg = tmp_path / "c.yaml"
    cfg.write_text("arch: bart_tiny\nfp16: true\nreset-optimizer: true\nno-epoch-checkpoints: true\n")
    args = parse("data", "--config", str(cfg), "--no-fp16", "--no-reset-optimizer", "--epoch-checkpoints")
    assert (args.fp16, args.reset_optimizer, args.no_epoch_checkpoints) == (False, False, False)
    args = parse("data", "--config", str(cfg))
    assert (args.fp16, args.reset_optimizer, args.no_epoch_checkpoints) == (True, True, True)
    assert parse("data", "--arch", "bart_tiny", "--no-save", "--save").no_save is False
    # a negative form is no config key: it would read as the switch itself
    cfg.write_text("arch: bart_tiny\nno-fp16: true\n")
    with pytest.raises(SeqtrainError, match="unknown option 'no-fp16'"):
        parse("data", "--config", str(cfg))


# ---- issue 31: sizes bounded before anything is built, one rule for the command line and a config
ALIAS_BOMB = (
    "a: &a ["
    + ", ".join(['"lol"'] * 9)
    + "]\n"
    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
)  # 9 levels of 9 aliases each: 9^9 = 387 M strings once converted, from 414 bytes


BOUNDED = [
    ("bomb.yaml", ALIAS_BOMB, "bomb.yaml line 2: YAML aliases (*a) are not supported; write the value out"),
    ("merge.yaml", "a: &a {lr: 1}\nb:\n  <<: *a\n", "merge.yaml line 3: YAML aliases (*a) are not supported"),
    ("deep.yaml", "arch: " + "[" * 100_000 + "]" * 100_000 + "\n", "deep.yaml line 1: nested more than 100"),
    (
        "deep.json",
        '{"arch": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "deep.json: nested more than 100 levels",
    ),
    ("dup.yaml", "arch: bart_tiny\nlr: 0.1\nlr: 0.2\n", "dup.yaml line 3: 'lr' is given twice (also line 2)"),
    ("dupsec.yaml", "a:\n  lr: 1\n  lr: 2\n", "dupsec.yaml line 3: 'lr' is given twice (also line 2)"),
    ("int.yaml", "seed: " + "9" * 5000 + "\n", "int.yaml line 1: an integer of 5000 digits (at most 100)"),
    ("int.json", '{"seed": ' + "9" * 5000 + "}", "int.json: an integer of 5000 digits (at most 100)"),
    ("seed.yaml", "arch: bart_tiny\nseed: 3.7\n", "seed.yaml line 2 (seed): invalid value 3.7 (expected an"),
    ("seed.json", '{"arch": "bart_tiny", "seed": 3.0}', "seed.json (seed): invalid value 3.0 (expected an"),
    ("big.yaml", "arch: bart_tiny\n#" + "x" * (1 << 20) + "\n", "big.yaml: larger than 1 MiB; a config"),
    (
        "dup.json",
        '{"arch": "bart_tiny", "lr": 0.1, "lr": 0.2}',
        "dup.json: 'lr' is given twice in one object",
    ),
    (
        "spell.yaml",
        "max-tokens: 10\nmax_tokens: 20\n",
        "spell.yaml line 2 (max_tokens): 'max_tokens' and 'max-tok",
    ),
]


@pytest.mark.parametrize("name,text,message", BOUNDED, ids=[c[0] for c in BOUNDED])
def test_config_sizes_are_bounded_before_parsing(tmp_path, name, text, message):
    """Before: the alias bomb grew to gigabytes once converted, deep nesting gave RecursionError tracebacks, a
    5,000-digit integer Python's bare int-str ValueError (JSON: an AttributeError on it), a key given twice
    took the last value and seed: 3.7 became 3; a 100 MB file took 71 s."""
    cfg = tmp_path / name
    cfg.write_text(text)
    with pytest.raises(SeqtrainError) as e:
        parse("data", "--config", str(cfg))
    assert str(e.value) == f"--config {cfg}" + str(e.value).split(str(cfg), 1)[1]
    assert message in str(e.value) and "\n" not in str(e.value)


def test_config_anchors_without_aliases_and_int_flags_still_load(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("arch: &x bart_tiny\nseed: 7\nmax-tokens: 4_096\nlr: 0.5\n")
    args = parse("data", "--config", str(cfg))
    assert (args.arch, args.seed, args.max_tokens, args.lr) == ("bart_tiny", 7, 4096, [0.5])
