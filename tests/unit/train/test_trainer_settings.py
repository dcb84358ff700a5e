"""Settings owned by their components (seqtrain.config): the Trainer's composed config read from real command
lines, and the declaration features the training components use (nesting, registry choices, positionals, flags
whose default differs from their field's, ranges)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from seqtrain import registry
from seqtrain.checkpoint.options import CheckpointConfig
from seqtrain.config import add_settings, from_args
from seqtrain.criterions.cross_entropy import CriterionConfig
from seqtrain.data.dictionary import Dictionary
from seqtrain.flags.parsers import ArgumentParser, UsageError
from seqtrain.flags.training import parse_train_args
from seqtrain.models.bart import BartConfig, build_model
from seqtrain.optim.optimizers import OPTIMIZER_CONFIGS
from seqtrain.tasks.translation import TranslationConfig
from seqtrain.train.loop import trainer_config


def _train(*flags: str) -> argparse.Namespace:
    return parse_train_args(["DATA", "--arch", "bart_base", "--max-tokens", "64", *flags])


def test_trainer_config_nests_the_groups_it_reads_from_one_command_line():
    args = _train("--clip-norm", "0.5", "--store-ema", "--ema-decay", "0.9", "--update-freq", "2,3")
    args.bf16, args.device_id = True, 3  # as a launcher sets them
    cfg = trainer_config(args)
    assert cfg.update.clip_norm == 0.5 and cfg.update.update_freq == [2, 3]
    assert cfg.ema.store_ema and cfg.ema.ema_decay == 0.9 and cfg.ema.ema_update_freq == 1
    assert cfg.device.bf16 and not cfg.device.fp16 and cfg.launch.device_id == 3
    assert cfg.precision.bf16_mode == "autocast" and cfg.optimizer == "adam"
    assert cfg.loss_scaler.fp16_init_scale == 128 and cfg.checkpoint.save_dir == "checkpoints"


def test_a_hand_made_namespace_gets_the_declared_defaults():
    cfg = trainer_config(argparse.Namespace(clip_norm=1.0))
    assert cfg.update.clip_norm == 1.0 and cfg.update.update_freq == [1] and cfg.device.seed == 1
    assert cfg.ema.ema_decay == 0.9999 and cfg.checkpoint.keep_last_epochs == -1


def test_model_flags_default_to_none_so_the_preset_fills_them_but_the_config_keeps_its_own():
    p = argparse.ArgumentParser()
    add_settings(p, BartConfig)
    assert p.parse_args([]).encoder_layers is None and p.parse_args([]).share_all_embeddings is None
    assert BartConfig().encoder_layers == 6 and BartConfig().share_all_embeddings is True
    flags = argparse.Namespace(dropout=0.3, activation_dropout=0.0, relu_dropout=0.2, encoder_embed_dim=8)
    cfg = from_args(BartConfig, flags, vocab_size=99)
    assert (cfg.vocab_size, cfg.dropout, cfg.activation_dropout, cfg.encoder_layers) == (99, 0.3, 0.0, 6)
    small = replace(cfg, encoder_layers=1, decoder_layers=1, decoder_embed_dim=8, encoder_ffn_embed_dim=8)
    small = replace(small, decoder_ffn_embed_dim=8, encoder_attention_heads=2, decoder_attention_heads=2)
    d = Dictionary()
    built = build_model(small, d, d).cfg  # fairseq's --relu-dropout: read where --activation-dropout is 0
    assert (built.vocab_size, built.activation_dropout) == (len(d), 0.2)


def test_registry_choices_are_read_when_the_parser_is_built():
    @registry.CRITERIONS.register("test_settings_plugin_criterion")
    class Plugin:  # a --user-dir plugin registered after the settings class was declared
        pass

    try:
        p = argparse.ArgumentParser()
        add_settings(p, CriterionConfig)
        assert p.parse_args(["--criterion", "test_settings_plugin_criterion"]).criterion == (
            "test_settings_plugin_criterion"
        )
        assert registry.CRITERIONS.get("test_settings_plugin_criterion") is Plugin
    finally:
        registry.CRITERIONS._entries.pop("test_settings_plugin_criterion", None)


def test_positional_setting_and_the_first_declarer_owns_a_flag():
    p = argparse.ArgumentParser()
    add_settings(p, TranslationConfig)
    p.add_argument("--save-dir", default="mine")
    add_settings(p, CheckpointConfig)  # its --save-dir is skipped: the parser has one
    args = p.parse_args(["bin1:bin2"])
    assert args.data == "bin1:bin2" and args.save_dir == "mine" and args.keep_last_epochs == -1


def test_ranges_declared_on_fields_are_checked_when_parsing():
    p = ArgumentParser()
    add_settings(p, OPTIMIZER_CONFIGS["nag"])
    add_settings(p, CheckpointConfig)
    assert p.parse_args(["--momentum", "0.5", "--keep-last-epochs", "-1"]).momentum == 0.5
    with pytest.raises(UsageError, match="--momentum: must be between 0 and 1, got 2"):
        p.parse_args(["--momentum", "2"])
    with pytest.raises(UsageError, match="--keep-last-epochs: must be -1 \\(off\\) or between 0 and"):
        p.parse_args(["--keep-last-epochs", "-2"])
    assert from_args(CheckpointConfig, p.parse_args(["--patience", "3"])).patience == 3
