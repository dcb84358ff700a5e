"""configs/*.yaml: each preset parses for seqtrain-train and seqtrain-generate with the recipe's values; each CLI
skips the other's keys, flags override the file, and keys that belong to neither CLI (typos) are errors."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from seqtrain.checkpoint.fairseq import model_config
from seqtrain.errors import SeqtrainError
from seqtrain.flags import training
from seqtrain.generation import options

ROOT = str(pathlib.Path(__file__).resolve().parents[3])
CONFIGS = os.path.join(ROOT, "configs")


def train_args(*argv: str):
    # as seqtrain-train: the preset's generation keys are seqtrain-generate's, skipped
    return training.parse_train_args(list(argv), options.generation_flags)


def generate_args(*argv: str):
    return options.parse_generation_args(list(argv))


def cfg(name: str) -> str:
    return os.path.join(CONFIGS, name + ".yaml")


# fairseq's examples/bart/README.summarization.md: shared fine-tuning flags, then per-recipe values
FINETUNE = dict(
    task="translation",
    truncate_source=True,
    share_all_embeddings=True,
    share_decoder_input_output_embed=True,
    layernorm_embedding=True,
    required_batch_size_multiple=1,
    max_tokens=16384,  # fairseq's 8 GPUs x 2,048 on one 80 GB GPU, update-freq unchanged (preset comments)
    skip_invalid_size_inputs_valid_test=True,
    reset_optimizer=True,
    reset_dataloader=True,
    reset_meters=True,
    find_unused_parameters=False,  # BART has none; fairseq's recipe sets it, at a cost per step
    criterion="label_smoothed_cross_entropy",
    label_smoothing=0.1,
    dropout=0.1,
    attention_dropout=0.1,
    weight_decay=0.01,
    optimizer="adam",
    adam_betas="(0.9, 0.999)",
    adam_eps=1e-08,
    clip_norm=0.1,
    lr_scheduler="polynomial_decay",
    lr=[3e-05],
    warmup_updates=500,
    fp16=True,
    restore_file="checkpoint_last.pt",
)  # the released weights' path is the user's (a comment there)
RECIPES = {
    "bart_base_cnndm": (
        dict(
            arch="bart_base",
            encoder_embed_dim=768,
            encoder_layers=6,
            total_num_update=20000,
            max_update=20000,
            update_freq=[4],
        ),
        dict(beam=4, lenpen=2.0, max_len_b=140, min_len=55, no_repeat_ngram_size=3),
    ),
    "bart_large_cnndm": (
        dict(
            arch="bart_large",
            encoder_embed_dim=1024,
            encoder_layers=12,
            total_num_update=20000,
            max_update=20000,
            update_freq=[4],
        ),
        dict(beam=4, lenpen=2.0, max_len_b=140, min_len=55, no_repeat_ngram_size=3),
    ),
    "bart_large_xsum": (
        dict(
            arch="bart_large",
            encoder_embed_dim=1024,
            encoder_layers=12,
            total_num_update=15000,
            max_update=15000,
            update_freq=[2],
        ),
        dict(beam=6, lenpen=1.0, max_len_b=60, min_len=10, no_repeat_ngram_size=3),
    ),
}
GENERATION_ONLY = ("beam", "lenpen", "max_len_b", "min_len", "no_repeat_ngram_size")
TRAINING_ONLY = ("arch", "lr", "criterion", "label_smoothing", "warmup_updates", "update_freq", "clip_norm")


def assert_values(args, expected):
    got = {k: getattr(args, k) for k in expected}
    assert got == expected


def test_every_config_is_covered():
    assert sorted(f[:-5] for f in os.listdir(CONFIGS) if f.endswith(".yaml")) == sorted(
        [*RECIPES, "debdesc_small", "debdesc_pretrain", "debdesc_finetune"]
    )


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_fairseq_bart_recipes_parse_for_both_clis(name):
    train, gen = RECIPES[name]
    args = train_args("bin", "--config", cfg(name))
    assert_values(args, {**FINETUNE, **train})
    assert args.config == cfg(name) and args.data == "bin"
    assert not any(hasattr(args, k) for k in GENERATION_ONLY)  # skipped, not smuggled into training args

    g = generate_args("bin", "--config", cfg(name), "--path", "model.pt")
    assert_values(g, {**gen, "max_tokens": 16384, "truncate_source": True, "fp16": True, "path": "model.pt"})
    assert not any(hasattr(g, k) for k in TRAINING_ONLY)


def test_debdesc_small_parses_and_builds_its_model():
    from seqtrain.data.dictionary import Dictionary
    from seqtrain.models.bart import build_model

    args = train_args("bin", "--config", cfg("debdesc_small"))
    assert_values(
        args,
        dict(
            arch="bart_small",
            encoder_layers=3,
            decoder_layers=3,
            encoder_embed_dim=256,
            encoder_ffn_embed_dim=1024,
            max_source_positions=48,
            truncate_source=True,
            encoder_normalize_before=True,
            decoder_normalize_before=True,
            weight_init="xavier",
            max_tokens=2048,
            lr=[0.001],
            lr_scheduler="inverse_sqrt",
            warmup_updates=200,
            label_smoothing=0.1,
            adam_betas="(0.9, 0.98)",
            clip_norm=1.0,
            dropout=0.1,
            no_epoch_checkpoints=True,
            fp16=False,
            bf16=False,
        ),
    )
    d = Dictionary()
    for i in range(8004):  # the 8,008-symbol dictionary of a sentencepiece-8000 debdesc data-bin
        d.add_symbol(f"w{i}")
    model = build_model(model_config(args), d, d)
    assert len(d) == 8008
    # 7,647,232 for post-norm BART with 128 source positions: 80 fewer positions (-20,480), two final layer norms
    # of pre-norm stacks (+1,024)
    assert sum(p.numel() for p in model.parameters()) == 7_627_776
    assert model.max_positions() == (48, 128)
    assert model.encoder.layer_norm is not None and model.encoder.layers[0].normalize_before
    g = generate_args("bin", "--config", cfg("debdesc_small"))
    assert_values(
        g, dict(beam=4, lenpen=1.0, max_len_b=30, min_len=1, no_repeat_ngram_size=3, max_tokens=2048)
    )


def test_debdesc_pretrain_is_the_denoising_task_on_debdesc_smalls_model():
    """configs/debdesc_pretrain.yaml (scripts/quality/pretrain.sh): BART's text infilling and sentence
    permutation on 48-position blocks, with the model debdesc_small.yaml fine-tunes (130 position rows on both
    sides, so it exports to Hugging Face)."""
    args = train_args("bin", "--config", cfg("debdesc_pretrain"))
    small = train_args("bin", "--config", cfg("debdesc_small"))
    model_keys = (
        "arch",
        "encoder_layers",
        "decoder_layers",
        "encoder_embed_dim",
        "encoder_ffn_embed_dim",
        "share_all_embeddings",
        "encoder_normalize_before",
        "decoder_normalize_before",
        "weight_init",
        "dropout",
        "max_target_positions",
    )
    assert_values(args, {k: getattr(small, k) for k in model_keys})
    assert_values(
        args,
        dict(
            task="denoising",
            tokens_per_sample=48,
            sample_break_mode="complete",
            mask=0.3,
            mask_random=0.1,
            mask_length="span-poisson",
            poisson_lambda=3.5,
            replace_length=1,
            permute_sentences=1.0,
            rotate=0.0,
            insert=0.0,
            criterion="cross_entropy",
            max_source_positions=128,
            max_target_positions=128,
            max_update=3000,
        ),
    )


def test_debdesc_finetune_is_debdesc_smalls_model_with_the_adaptive_recipe():
    """configs/debdesc_finetune.yaml (the README's own-data recipe): the model and batches debdesc_small.yaml
    builds, fine-tuned from the bundled model at lr 5e-4 with 60 warm-up updates for at most 30 epochs,
    checkpoint_best.pt chosen by validation ROUGE-Lsum (decoded as the preset's generation settings), stopped
    after 5 validations without a better one; the same generation settings for seqtrain-generate, which the
    checkpoints store."""
    args = train_args("bin", "--config", cfg("debdesc_finetune"))
    small = train_args("bin", "--config", cfg("debdesc_small"))
    same = (
        "arch encoder_layers encoder_embed_dim share_all_embeddings encoder_normalize_before decoder_normalize_before "
        "weight_init dropout max_source_positions max_target_positions truncate_source max_tokens criterion "
        "label_smoothing adam_betas clip_norm"
    ).split()
    assert_values(args, {k: getattr(small, k) for k in same})
    assert_values(
        args,
        dict(
            lr=[0.0005],
            lr_scheduler="inverse_sqrt",
            warmup_updates=60,
            max_update=0,
            max_epoch=30,
            patience=5,
            eval_rouge=True,
            best_checkpoint_metric="rouge_lsum",
            maximize_best_checkpoint_metric=True,
            validate_interval=1,
            finetune_from_model="models/debdesc-small-denoising",  # the start: without it, from scratch
        ),
    )
    assert json.loads(args.eval_rouge_args) == {"beam": 4, "max_len_b": 30, "no_repeat_ngram_size": 3}
    want = dict(beam=4, lenpen=1.0, max_len_b=30, min_len=1, no_repeat_ngram_size=3)
    assert_values(generate_args("bin", "--config", cfg("debdesc_finetune")), want)
    assert options.preset_generation(cfg("debdesc_finetune")).settings == want


def test_command_line_flags_override_the_config():
    args = train_args(
        "bin",
        "--config",
        cfg("bart_large_xsum"),
        "--lr",
        "1e-05",
        "--update-freq",
        "16",
        "--max-tokens",
        "1024",
        "--arch",
        "bart_base",
    )
    assert (args.lr, args.update_freq, args.max_tokens, args.arch, args.encoder_embed_dim) == (
        [1e-05],
        [16],
        1024,
        "bart_base",
        768,
    )
    assert args.total_num_update == 15000  # the rest still comes from the file
    g = generate_args("bin", "--config", cfg("bart_large_xsum"), "--beam", "2", "--lenpen", "0.5")
    assert (g.beam, g.lenpen, g.max_len_b) == (2, 0.5, 60)


@pytest.mark.parametrize(
    "typo,flag,suggestion",
    [
        ("beem: 4", "beem", "beam"),
        ("lr-schedular: cosine", "lr-schedular", "lr-scheduler"),
        ("no-repeat-ngram: 3", "no-repeat-ngram", "no-repeat-ngram-size"),
    ],
)
def test_keys_of_neither_cli_are_errors_in_both(tmp_path, typo, flag, suggestion):
    path = tmp_path / "preset.yaml"
    path.write_text("arch: bart_tiny\nbeam: 4\nlr: 0.001\n" + typo + "\n")
    pattern = rf"preset.yaml line 4 \({flag}\): unknown option '{flag}'; did you mean '{suggestion}'\?"
    with pytest.raises(SeqtrainError, match=pattern):
        train_args("bin", "--config", str(path))
    with pytest.raises(SeqtrainError, match=pattern):
        generate_args("bin", "--config", str(path))


def test_bad_values_of_the_other_clis_keys_are_still_errors(tmp_path):
    path = tmp_path / "preset.yaml"
    path.write_text("arch: bart_tiny\nbeam: wide\n")
    with pytest.raises(SeqtrainError, match=r"line 2 \(beam\): invalid value 'wide'"):
        train_args("bin", "--config", str(path))
    path.write_text("arch: bart_tiny\nwarmup-updates: soon\n")
    with pytest.raises(SeqtrainError, match=r"line 2 \(warmup-updates\): invalid value 'soon'"):
        generate_args("bin", "--config", str(path))


def test_generate_knows_the_training_flags_of_the_configs_scheduler(tmp_path):
    """The scheduler's own flags (here cosine's --max-lr) are training keys for seqtrain-generate too."""
    path = tmp_path / "preset.yaml"
    path.write_text("arch: bart_tiny\nlr-scheduler: cosine\nmax-lr: 0.01\nbeam: 3\n")
    assert generate_args("bin", "--config", str(path)).beam == 3
    assert train_args("bin", "--config", str(path)).max_lr == 0.01
    path.write_text("arch: bart_tiny\nlr-scheduler: inverse_sqrt\nmax-lr: 0.01\n")  # not inverse_sqrt's flag
    with pytest.raises(SeqtrainError, match=r"unknown option 'max-lr'"):
        generate_args("bin", "--config", str(path))
