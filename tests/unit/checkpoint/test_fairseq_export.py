"""`seqtrain-convert --to fairseq` writes what fairseq 0.12's loader reads (no fairseq needed here).

The expectations below were written from fairseq 0.12's code:
- checkpoint_utils._upgrade_state_dict runs on every load. It reads `optimizer_history[-1]` (an empty list is an
  IndexError) and, when they are missing, invents the optimizer name (FairseqNAG), lr_scheduler_state and
  num_updates; it reads `extra_state["train_iterator"]`. Trainer.load_checkpoint compares criterion_name and
  optimizer_name with the running components' class names and restores num_updates.
- convert_namespace_to_omegaconf turns `args` into the config: every field of FairseqConfig's groups that `args`
  has is passed as an override of the field's declared type, so None in a typed field ("Error merging override
  distributed_training.distributed_backend=null") and a float `lr` are refused; the task's fields are
  TranslationConfig's; `args.arch` must be in ARCH_MODEL_REGISTRY.
- models/bart/model.py registers bart_large, bart_base, mbart_large, mbart_base, mbart_base_wmt20. The arch
  functions fill only attributes that are missing (getattr(args, name, default)), so a dimension left out
  becomes bart_base's or bart_large's.
"""

import argparse

import pytest
import torch

from seqtrain.checkpoint.fairseq import export_args, model_config
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.native import make_checkpoint_state
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.flags.training import parse_train_args
from seqtrain.models.bart import build_model
from seqtrain.registry import ARCHS
from seqtrain_cli.convert import cli_main
from tests.utils import completed

FAIRSEQ_BART_ARCHS = {"bart_large", "bart_base", "mbart_large", "mbart_base", "mbart_base_wmt20"}
# What bart_large_architecture fills from its own defaults when absent: each must be written explicitly.
ARCH_FILLED = {
    "encoder_embed_dim": int,
    "encoder_ffn_embed_dim": int,
    "encoder_layers": int,
    "encoder_attention_heads": int,
    "encoder_normalize_before": bool,
    "encoder_learned_pos": bool,
    "decoder_embed_dim": int,
    "decoder_ffn_embed_dim": int,
    "decoder_layers": int,
    "decoder_attention_heads": int,
    "decoder_normalize_before": bool,
    "decoder_learned_pos": bool,
    "decoder_output_dim": int,
    "decoder_input_dim": int,
    "attention_dropout": float,
    "activation_dropout": float,
    "dropout": float,
    "max_source_positions": int,
    "max_target_positions": int,
    "share_all_embeddings": bool,
    "share_decoder_input_output_embed": bool,
    "no_scale_embedding": bool,
    "layernorm_embedding": bool,
    "activation_fn": str,
}
# The other names a fairseq BART/transformer reads from args (fairseq/models/transformer, bart)
OTHER_MODEL_ARGS = {
    "relu_dropout",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "pooler_activation_fn",
    "pooler_dropout",
    "no_token_positional_embeddings",
    "adaptive_input",
    "cross_self_attention",
    "no_cross_attention",
    "tie_adaptive_weights",
    "quant_noise_pq",
}
# TranslationConfig's fields (fairseq/tasks/translation.py) that an export may hold, with their types
TRANSLATION_FIELDS = {
    "source_lang": str,
    "target_lang": str,
    "left_pad_source": bool,
    "left_pad_target": bool,
    "truncate_source": bool,
    "max_source_positions": int,
    "max_target_positions": int,
}
COMPONENTS = {
    "task": {"translation"},
    "criterion": {"cross_entropy", "label_smoothed_cross_entropy"},
    "optimizer": {"adam", "nag", "sgd", "adafactor"},
    "lr_scheduler": {"fixed", "inverse_sqrt", "polynomial_decay", "reduce_lr_on_plateau", "cosine"},
}
CLASS_NAMES = {
    "cross_entropy": "CrossEntropyCriterion",
    "label_smoothed_cross_entropy": "LabelSmoothedCrossEntropyCriterion",
    "adam": "FairseqAdam",
    "nag": "FairseqNAG",
    "sgd": "SGD",
    "adafactor": "FairseqAdafactor",
}


def check_args(args: argparse.Namespace) -> None:
    """What convert_namespace_to_omegaconf and the BART arch functions need of `args`."""
    assert isinstance(args, argparse.Namespace)
    items = vars(args)
    assert args.arch in FAIRSEQ_BART_ARCHS
    for name, value in items.items():
        assert value is not None, name
    allowed = set(ARCH_FILLED) | OTHER_MODEL_ARGS | set(TRANSLATION_FIELDS) | set(COMPONENTS)
    allowed |= {"arch", "label_smoothing"}
    assert set(items) <= allowed, sorted(set(items) - allowed)
    for name, kind in {**ARCH_FILLED, **TRANSLATION_FIELDS}.items():
        if name in ARCH_FILLED:
            assert name in items, f"{name} left to fairseq's arch default"
        if name in items:
            # bool is an int subclass: ask for the exact type fairseq's schema declares
            assert type(items[name]) is kind or (kind is float and type(items[name]) is int), name
    for name, known in COMPONENTS.items():
        assert items[name] in known, name
    if args.criterion == "label_smoothed_cross_entropy":
        assert isinstance(args.label_smoothing, float)


def check_loadable(state: dict) -> None:
    """What _upgrade_state_dict and Trainer.load_checkpoint read."""
    assert {"args", "model", "optimizer_history", "extra_state", "last_optimizer_state"} <= set(state)
    check_args(state["args"])
    last = state["optimizer_history"][-1]
    assert "optimizer" not in last
    assert last["criterion_name"] == CLASS_NAMES[state["args"].criterion]
    assert last["optimizer_name"] == CLASS_NAMES[state["args"].optimizer]
    assert isinstance(last["lr_scheduler_state"], dict) and "best" in last["lr_scheduler_state"]
    assert type(last["num_updates"]) is int
    itr = state["extra_state"]["train_iterator"]
    assert itr["epoch"] >= 1 and type(itr["iterations_in_epoch"]) is int
    assert state["last_optimizer_state"] is None
    assert state["model"]["encoder.version"].item() == 3.0


@pytest.mark.parametrize("arch", sorted(ARCHS.names()))
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_every_preset_exports_fairseq_args(tmp_path, arch, pre_norm):
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if pre_norm else []
    args = parse_train_args([str(tmp_path), "--arch", arch, "--max-tokens", "64", *extra])
    out = export_args(args)
    check_args(out)
    # fairseq has these names; bart_small/bart_tiny are seqtrain's sizes
    want = arch if arch in ("bart_large", "mbart_large", "mbart_base") else "bart_base"
    assert out.arch == want
    pre_norm = pre_norm or arch.startswith("mbart")  # mBART's presets are pre-norm
    for name in ARCH_FILLED:
        if getattr(args, name, None) is not None:
            assert getattr(out, name) == getattr(args, name), name
    assert out.decoder_output_dim == out.decoder_input_dim == args.decoder_embed_dim
    assert (out.encoder_normalize_before, out.decoder_normalize_before) == (pre_norm, pre_norm)
    # seqtrain-only and unset training args are not written
    assert (
        not hasattr(out, "weight_init") and not hasattr(out, "distributed_backend") and not hasattr(out, "lr")
    )


def test_mbart_layout_exports_as_mbart(tmp_path):
    """Pre-norm with scaled embeddings is mBART's layout: a seqtrain-only arch with it exports as mbart_*."""
    args = parse_train_args(
        [str(tmp_path), "--arch", "bart_small", "--max-tokens", "64", "--encoder-normalize-before"]
    )
    args.arch, args.no_scale_embedding = "bart_custom", False
    assert export_args(args).arch == "mbart_base"


def convert(*argv: str) -> int:
    with pytest.raises(SystemExit) as e:
        cli_main(list(argv))
    return e.value.code


def test_trained_checkpoint_exports_loadable(tmp_path):
    """A checkpoint as seqtrain-train writes it (every training arg, training state) -> a loadable export that
    carries the update count, data position and best loss over."""
    from tests.unit.checkpoint.test_convert import make_dict

    argv = [
        str(tmp_path),
        "--arch",
        "bart_tiny",
        "--max-tokens",
        "64",
        "--criterion",
        "label_smoothed_cross_entropy",
    ]
    args = parse_train_args(argv + ["--label-smoothing", "0.1", "--lr-scheduler", "inverse_sqrt"])
    d = make_dict(20)
    torch.manual_seed(0)
    model = build_model(model_config(completed(args)), d, d)
    run = TrainState(epoch=3, num_updates=42, best=2.5, train_iterator={"epoch": 3, "iterations_in_epoch": 4})
    save_checkpoint_file(
        make_checkpoint_state(args, model.state_dict(), d, d, training=run), str(tmp_path / "c.pt")
    )
    assert convert(str(tmp_path / "c.pt"), str(tmp_path / "fq" / "model.pt"), "--to", "fairseq") == 0
    state = load_checkpoint_file(str(tmp_path / "fq" / "model.pt"))
    check_loadable(state)
    last = state["optimizer_history"][-1]
    assert (last["criterion_name"], last["num_updates"], last["lr_scheduler_state"]["best"]) == (
        "LabelSmoothedCrossEntropyCriterion",
        42,
        2.5,
    )
    assert state["extra_state"]["train_iterator"] == {"epoch": 3, "iterations_in_epoch": 4}
    assert (state["args"].lr_scheduler, state["args"].label_smoothing) == ("inverse_sqrt", 0.1)
    for k, v in model.state_dict().items():
        assert torch.equal(state["model"][k], v), k


def test_fairseq_checkpoint_round_trips(tmp_path, fairseq_tiny):
    """fairseq's own checkpoint -> --to fairseq: the same model args, weights and training history."""
    out = tmp_path / "model.pt"
    assert (
        convert(
            str(fairseq_tiny / "checkpoint_last.pt"),
            str(out),
            "--to",
            "fairseq",
            "--dict",
            str(fairseq_tiny / "data-bin"),
        )
        == 0
    )
    state = load_checkpoint_file(str(out))
    check_loadable(state)
    orig = load_checkpoint_file(str(fairseq_tiny / "checkpoint_last.pt"))
    model_cfg = vars(orig["cfg"]["model"])
    for name, value in vars(state["args"]).items():
        if name in model_cfg:
            assert value == model_cfg[name], name
    assert (
        orig["optimizer_history"][-1]["num_updates"] == state["optimizer_history"][-1]["num_updates"] == 300
    )
    assert state["optimizer_history"][-1]["criterion_name"] == "LabelSmoothedCrossEntropyCriterion"
    assert state["extra_state"]["train_iterator"] == {"epoch": 19, "iterations_in_epoch": 12}
    for k, v in orig["model"].items():
        assert torch.equal(state["model"][k], v), k
