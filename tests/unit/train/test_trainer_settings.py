"""Settings owned by their components (seqtrain.config): seqtrain-train's TrainConfig and the Trainer's composed
config read from real command lines, the registry door from a component to its settings (a made criterion's own
flag reaches it), and the declaration features the training components use (nesting, registry choices,
positionals, flags whose default differs from their field's, ranges)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from seqtrain import registry
from seqtrain.checkpoint.options import CheckpointConfig
from seqtrain.config import add_settings, from_args, setting, settings
from seqtrain.criterions import CrossEntropyCriterion, build_criterion
from seqtrain.criterions.cross_entropy import CriterionConfig
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import Bounds
from seqtrain.flags.parsers import ArgumentParser, UsageError
from seqtrain.flags.training import get_training_parser, parse_train_args
from seqtrain.models.bart import BartConfig, as_built, build_model
from seqtrain.optim.lr_scheduler import CosineConfig
from seqtrain.optim.optimizers import NagConfig
from seqtrain.tasks.denoising import DenoisingConfig
from seqtrain.tasks.translation import TranslationConfig
from seqtrain.train.program import train_config
from tests.unit.criterions.test_criterions import PAD, ToyModel, make_sample


def _train(*flags: str) -> argparse.Namespace:
    return parse_train_args(["DATA", "--arch", "bart_base", "--max-tokens", "64", *flags])


def test_trainer_config_nests_the_groups_it_reads_from_one_command_line():
    args = _train("--clip-norm", "0.5", "--store-ema", "--ema-decay", "0.9", "--update-freq", "2,3")
    args.bf16, args.device_id = True, 3
    cfg = train_config(args).trainer
    assert cfg.update.clip_norm == 0.5 and cfg.update.update_freq == [2, 3]
    assert cfg.ema.store_ema and cfg.ema.ema_decay == 0.9 and cfg.ema.ema_update_freq == 1
    assert cfg.device.bf16 and not cfg.device.fp16 and cfg.launch.device_id == 3
    assert cfg.precision.bf16_mode == "autocast" and cfg.optimizer == "adam"
    assert cfg.loss_scaler.fp16_init_scale == 128 and cfg.checkpoint.save_dir == "checkpoints"


def test_a_hand_made_namespace_gets_the_declared_defaults():
    cfg = train_config(argparse.Namespace(clip_norm=1.0)).trainer
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
        registry.CRITERIONS.unregister("test_settings_plugin_criterion")


def test_positional_setting_and_the_first_declarer_owns_a_flag():
    p = argparse.ArgumentParser()
    add_settings(p, TranslationConfig)
    p.add_argument("--save-dir", default="mine")
    add_settings(p, CheckpointConfig)  # its --save-dir is skipped: the parser has one
    args = p.parse_args(["bin1:bin2"])
    assert args.data == "bin1:bin2" and args.save_dir == "mine" and args.keep_last_epochs == -1


def test_ranges_declared_on_fields_are_checked_when_parsing():
    p = ArgumentParser()
    add_settings(p, registry.OPTIMIZERS.config("nag"))
    add_settings(p, CheckpointConfig)
    assert p.parse_args(["--momentum", "0.5", "--keep-last-epochs", "-1"]).momentum == 0.5
    with pytest.raises(UsageError, match="--momentum: must be between 0 and 1, got 2"):
        p.parse_args(["--momentum", "2"])
    with pytest.raises(UsageError, match="--keep-last-epochs: must be -1 \\(off\\) or between 0 and"):
        p.parse_args(["--keep-last-epochs", "-2"])
    assert from_args(CheckpointConfig, p.parse_args(["--patience", "3"])).patience == 3


def test_train_config_reads_the_flags_once_into_each_component_and_group():
    flags = ["--task", "denoising", "--mask", "0.3", "--optimizer", "nag", "--momentum", "0.5"]
    flags += [
        "--lr-scheduler",
        "cosine",
        "--warmup-updates",
        "3",
        "--criterion",
        "label_smoothed_cross_entropy",
    ]
    flags += ["--label-smoothing", "0.1", "--max-update", "7", "--validate-interval-updates", "5"]
    args = _train(*flags, "--log-interval", "9", "--encoder-layers-to-keep", "0", "--save-dir", "out")
    cfg = train_config(args)
    # the chosen components' settings: their registries' classes
    assert type(cfg.task) is DenoisingConfig and cfg.task.mask == 0.3 and cfg.task.data == "DATA"
    assert cfg.task.dataset is cfg.data and cfg.data.max_tokens == 64  # one object: what the task settles
    assert type(cfg.optimizer) is NagConfig and (cfg.optimizer.momentum, cfg.optimizer.optimizer) == (
        0.5,
        "nag",
    )
    assert type(cfg.lr_scheduler) is CosineConfig and cfg.lr_scheduler.warmup_updates == 3
    assert type(cfg.criterion) is CriterionConfig and cfg.criterion.label_smoothing == 0.1
    assert (cfg.model.encoder_embed_dim, cfg.model.encoder_layers, cfg.model.encoder_layers_to_keep) == (
        768,
        6,
        "0",
    )
    assert as_built(cfg.model).encoder_layers == 1  # what the record stores: the model that is built
    # the groups
    assert (cfg.loop.update.max_update, cfg.loop.validation.validate_interval_updates) == (7, 5)
    assert cfg.loop.logging.log_interval == 9 and cfg.checkpoint.save_dir == "out" and cfg.arch == "bart_base"
    trainer = cfg.trainer  # the Trainer's settings: the same objects
    assert trainer.update is cfg.loop.update and trainer.checkpoint is cfg.checkpoint
    assert (
        trainer.optim is cfg.optimizer and trainer.schedule is cfg.lr_scheduler and trainer.optimizer == "nag"
    )
    assert trainer.encoder_layers_to_keep == "0" and trainer.max_tokens == 64
    assert cfg.flags == vars(args) and cfg.flags is not vars(args)  # the record's base, a copy


@settings
class WeightedConfig(CriterionConfig):
    """criterion: test_weighted_cross_entropy's settings (a made criterion with a flag of its own)"""

    loss_weight: float = setting(
        1.0, "multiply the loss by W", type=float, metavar="W", bounds=Bounds(0, 100)
    )


class WeightedCrossEntropy(CrossEntropyCriterion):
    @classmethod
    def from_config(cls, cfg: WeightedConfig, padding_idx: int) -> WeightedCrossEntropy:
        criterion = super().from_config(cfg, padding_idx)
        criterion.weight = cfg.loss_weight
        return criterion

    def forward(self, model, sample, reduce=True):
        loss, sample_size, log = super().forward(model, sample, reduce)
        return loss * self.weight, sample_size, log


def test_a_made_criterion_registered_with_its_settings_gets_its_own_flag():
    registry.CRITERIONS.register("test_weighted_cross_entropy", config=WeightedConfig)(WeightedCrossEntropy)
    try:
        help_text = get_training_parser().format_help()
        assert "--loss-weight W" in help_text and "multiply the loss by W" in help_text
        cfg = train_config(_train("--criterion", "test_weighted_cross_entropy", "--loss-weight", "3"))
        assert type(cfg.criterion) is WeightedConfig and cfg.criterion.loss_weight == 3.0
        weighted = build_criterion(cfg.criterion, PAD)
        plain = build_criterion(train_config(_train()).criterion, PAD)
        model, sample = ToyModel(), make_sample()
        assert weighted(model, sample)[0].item() == pytest.approx(
            3 * plain(model, sample)[0].item(), rel=1e-12
        )
        with pytest.raises(UsageError, match="--loss-weight: must be between 0 and 100, got 101"):
            _train("--criterion", "test_weighted_cross_entropy", "--loss-weight", "101")
        with pytest.raises(
            SeqtrainError,
            match="--loss-weight is read only by --criterion test_weighted_cross_entropy, not cross_entropy",
        ):
            train_config(_train("--loss-weight", "3"))
    finally:
        registry.CRITERIONS.unregister("test_weighted_cross_entropy")
    assert "--loss-weight" not in get_training_parser().format_help()
