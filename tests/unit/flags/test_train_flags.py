"""seqtrain-train's flags: arch presets under explicit flags, --config defaults, help groups, clear errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, training
from seqtrain.generation import options


def parse(*argv: str):
    return parsing.parse_args_and_arch(training.get_training_parser(), list(argv))


def test_arch_preset_fills_only_what_flags_leave_unset():
    args = parse(
        "data", "--arch", "bart_tiny", "--encoder-layers", "5", "--dropout", "0.3", "--max-tokens", "64"
    )
    assert (args.encoder_layers, args.dropout) == (5, 0.3)  # explicit flags win
    assert (args.decoder_layers, args.encoder_embed_dim, args.encoder_attention_heads) == (2, 64, 4)  # preset
    base = parse("data", "-a", "bart_base")
    assert (base.encoder_layers, base.encoder_embed_dim, base.decoder_ffn_embed_dim) == (6, 768, 3072)
    # fairseq's defaults for everything else
    assert (base.lr, base.update_freq, base.save_dir, base.restore_file, base.seed) == (
        [0.25],
        [1],
        "checkpoints",
        "checkpoint_last.pt",
        1,
    )
    assert (base.optimizer, base.lr_scheduler, base.criterion, base.task) == (
        "adam",
        "fixed",
        "cross_entropy",
        "translation",
    )


def test_component_choice_adds_its_flags():
    args = parse(
        "d",
        "-a",
        "bart_tiny",
        "--lr-scheduler",
        "polynomial_decay",
        "--total-num-update",
        "300",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--update-freq",
        "2,4",
    )
    assert (args.total_num_update, args.adam_betas, args.update_freq) == (300, "(0.9, 0.98)", [2, 4])
    # a scheduler's flag does not exist under another scheduler
    with pytest.raises(
        SeqtrainError,
        match="unrecognized arguments: --total-num-update 300: --total-num-update belongs to another",
    ):
        parse("d", "-a", "bart_tiny", "--total-num-update", "300")
    with pytest.raises(
        SeqtrainError, match="--lr-scheduler: unknown lr scheduler 'warp'; choose from: cosine"
    ):
        parse("d", "-a", "bart_tiny", "--lr-scheduler", "warp")
    with pytest.raises(SeqtrainError, match="--arch: unknown arch 'bart_huge'"):
        parse("d", "-a", "bart_huge")
    with pytest.raises(SeqtrainError, match="--arch is required; choose from: bart_base, bart_large"):
        parse("d")


def test_summarization_is_an_alias_of_translation():
    assert parse("d", "-a", "bart_tiny", "--task", "summarization").task == "summarization"
    from seqtrain.registry import TASKS

    assert TASKS.get("summarization") is TASKS.get("translation")


YAML = """# a preset
arch: bart_tiny
encoder-layers: 3          # beats the preset
lr: 0.0005
lr_scheduler: inverse_sqrt
warmup-updates: 40
max_tokens: 2048
update-freq: [2, 1]
no-epoch-checkpoints: true
adam-betas: "(0.9, 0.98)"
valid_subset: valid,test
"""


def test_config_yaml_gives_defaults_that_flags_override(tmp_path):
    cfg = tmp_path / "preset.yaml"
    cfg.write_text(YAML)
    args = parse("data", "--config", str(cfg))
    assert (args.arch, args.encoder_layers, args.decoder_layers) == ("bart_tiny", 3, 2)
    assert (args.lr, args.lr_scheduler, args.warmup_updates, args.max_tokens) == (
        [0.0005],
        "inverse_sqrt",
        40,
        2048,
    )
    assert (args.update_freq, args.no_epoch_checkpoints, args.adam_betas) == ([2, 1], True, "(0.9, 0.98)")
    assert args.valid_subset == "valid,test" and args.config == str(cfg)
    over = parse(
        "data",
        "--config",
        str(cfg),
        "--max-tokens",
        "512",
        "--encoder-layers",
        "4",
        "--lr",
        "1e-3",
        "--lr-scheduler",
        "polynomial_decay",
        "--total-num-update",
        "10",
        "-a",
        "bart_small",
    )
    assert (over.max_tokens, over.encoder_layers, over.lr, over.lr_scheduler) == (
        512,
        4,
        [1e-3],
        "polynomial_decay",
    )
    assert (over.arch, over.encoder_embed_dim, over.warmup_updates) == ("bart_small", 256, 40)


def test_config_json_and_data_from_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(
        json.dumps(
            {
                "data": "some/bin",
                "arch": "bart_tiny",
                "max-update": 7,
                "cpu": True,
                "label_smoothing": 0.1,
                "criterion": "label_smoothed_cross_entropy",
            }
        )
    )
    args = parse("--config", str(cfg))
    assert (args.data, args.max_update, args.cpu, args.label_smoothing) == ("some/bin", 7, True, 0.1)
    assert parse("other/bin", "--config", str(cfg)).data == "other/bin"


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "arch: bart_tiny\nmax-tokns: 5\n",
            r"--config .*bad.yaml line 2 \(max-tokns\): unknown option 'max-tokns'",
        ),
        ("arch: bart_tiny\nmax-tokens: lots\n", r"line 2 \(max-tokens\): invalid value 'lots'"),
        (
            "arch: bart_tiny\nlog-format: fancy\n",
            r"line 2 \(log-format\): 'fancy' is not one of tqdm, simple",
        ),
        ("model:\n  encoder-layer: 2\n", r"bad.yaml line 2 \(encoder-layer\): unknown option .*did you mean"),
    ],
)
def test_config_errors_name_file_line_and_key(tmp_path, text, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(SeqtrainError, match=message):
        parse("data", "--config", str(cfg))


def test_missing_config_file(tmp_path):
    with pytest.raises(SeqtrainError, match=r"--config .*nope.yaml: cannot read"):
        parse("data", "--config", str(tmp_path / "nope.yaml"))


@pytest.mark.slow
def test_help_groups_in_order():
    root = str(pathlib.Path(__file__).resolve().parents[3])
    out = subprocess.run(
        [sys.executable, "-m", "seqtrain_cli.train", "--help"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    titles = [
        line[:-1] for line in out.stdout.splitlines() if line and not line[0].isspace() and line.endswith(":")
    ]
    assert titles == [
        "options",
        "Common",
        "fp16 loss scaling",
        "Logging",
        "Dataset and batching",
        "Task (translation)",
        "Model configuration",
        "Criterion",
        "Optimization",
        "Optimizer (adam)",
        "LR scheduler (fixed)",
        "Fine-tuning: frozen weights",
        "EMA of the weights",
        "Checkpoint",
        "Distributed training",
        "fairseq compatibility",
    ]
    sections = out.stdout.split("\n\n")
    checkpoint = next(s for s in sections if s.startswith("Checkpoint:"))
    for flag in (
        "--save-dir DIR",
        "--save-interval-updates",
        "--keep-best-checkpoints",
        "--no-epoch-checkpoints",
        "--best-checkpoint-metric",
        "--patience",
        "--restore-file",
        "--reset-optimizer",
        "--finetune-from-model",
    ):
        assert flag in checkpoint, flag
    assert "(default: checkpoints)" in checkpoint
    assert "--max-update" in next(s for s in sections if s.startswith("Optimization:"))
    assert "--distributed-world-size" in next(s for s in sections if s.startswith("Distributed training:"))


def test_generation_parser_has_common_and_dataset_flags():
    parser = options.get_generation_parser()
    args = parsing.parse_args_and_arch(parser, ["bin", "--path", "ck.pt", "--gen-subset", "valid", "--cpu"])
    assert (args.data, args.path, args.gen_subset, args.cpu, args.seed) == ("bin", "ck.pt", "valid", True, 1)
