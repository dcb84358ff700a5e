"""fairseq BART checkpoints: read them (model args, parameter names, dict.txt beside them) and write them."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, fields
from typing import Any

import torch

import seqtrain.models.bart  # noqa: F401  (registers the bart_* archs in ARCHS)
from seqtrain.checkpoint.files import (
    CheckpointContents,
    cpu_state,
    save_checkpoint_file,
    strip_wrapper_prefix,
)
from seqtrain.checkpoint.train_state import EXTRA_STATE, TrainState
from seqtrain.data.dictionary import Dictionary, add_language_symbols
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import BartConfig, arch_config, as_built
from seqtrain.registry import ARCHS

# Model fields copied from a fairseq checkpoint's args; the arch preset's own fields are added to these at
# runtime.
MODEL_ARG_NAMES = (
    "arch",
    "encoder_embed_dim",
    "encoder_ffn_embed_dim",
    "encoder_layers",
    "encoder_attention_heads",
    "decoder_embed_dim",
    "decoder_ffn_embed_dim",
    "decoder_layers",
    "decoder_attention_heads",
    "decoder_output_dim",
    "decoder_input_dim",
    "max_source_positions",
    "max_target_positions",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "relu_dropout",
    "activation_fn",
    "share_all_embeddings",
    "share_decoder_input_output_embed",
    "no_scale_embedding",
    "layernorm_embedding",
    "encoder_normalize_before",
    "decoder_normalize_before",
    "encoder_learned_pos",
    "decoder_learned_pos",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "pooler_activation_fn",
    "pooler_dropout",
    # data conventions generation must reproduce
    "source_lang",
    "target_lang",
    "left_pad_source",
    "left_pad_target",
    "truncate_source",
    "prepend_bos",
    "langs",  # mBART's language codes (translation_from_pretrained_bart): [lang] symbols in the dictionary
)

# (field, value seqtrain's BART implements): a checkpoint with another value would load but compute
# differently
FAIRSEQ_REQUIRED = (
    ("layernorm_embedding", True),
    ("encoder_learned_pos", True),
    ("decoder_learned_pos", True),
    ("no_token_positional_embeddings", False),
    ("adaptive_softmax_cutoff", None),
    ("adaptive_input", False),
    ("cross_self_attention", False),
    ("no_cross_attention", False),
    ("encoder_layers_to_keep", None),
    ("decoder_layers_to_keep", None),
    ("quant_noise_pq", 0),
    ("tie_adaptive_weights", False),
)


def _model_arg_names() -> set:
    names = set(MODEL_ARG_NAMES)
    try:
        for arch in ARCHS.names():
            ns = argparse.Namespace()
            ARCHS.get(arch)(ns)
            names |= set(vars(ns))
    except ImportError:
        pass
    return names


def _flatten_dataclass_cfg(model_cfg: dict) -> dict:
    # fairseq's newer dataclass models nest encoder/decoder fields: {"encoder": {"embed_dim": ...}}
    flat = {k: v for k, v in model_cfg.items() if not isinstance(v, dict)}
    for side in ("encoder", "decoder"):
        for k, v in (model_cfg.get(side) or {}).items():
            if not isinstance(v, dict):
                flat.setdefault(f"{side}_{k}", v)
    return flat


def fairseq_args(path: str, obj: dict) -> argparse.Namespace:
    """Model args (fairseq names) from a fairseq checkpoint: `args` Namespace (old, e.g. released bart.large
    model.pt) or `cfg["model"]` Namespace / dict (fairseq >= 0.10)."""
    raw: dict[str, Any] = {}
    if obj.get("args") is not None:
        raw = dict(vars(obj["args"])) if isinstance(obj["args"], argparse.Namespace) else dict(obj["args"])
    elif isinstance(obj.get("cfg"), dict) and obj["cfg"].get("model") is not None:
        m = obj["cfg"]["model"]
        raw = dict(vars(m)) if isinstance(m, argparse.Namespace) else _flatten_dataclass_cfg(dict(m))
        task = obj["cfg"].get("task")
        task = vars(task) if isinstance(task, argparse.Namespace) else (task or {})
        for k, v in task.items():
            raw.setdefault(k, v)
    else:
        raise SeqtrainError(
            f"{path}: fairseq checkpoint without model args (neither 'args' nor cfg['model'])"
        )
    arch = raw.get("arch") or raw.get("_name")
    if not arch:
        raise SeqtrainError(f"{path}: fairseq checkpoint args name no architecture ('arch')")
    if not str(arch).startswith(("bart", "mbart")):
        raise SeqtrainError(
            f"{path}: fairseq architecture {arch!r} is not BART; seqtrain loads bart_* and mbart_* models"
        )
    raw["arch"] = arch
    for name, want in FAIRSEQ_REQUIRED:
        got = raw.get(name, want)
        if got not in (want,) and not (want in (False, None, 0) and not got):
            raise SeqtrainError(
                f"{path}: fairseq checkpoint uses {name}={got!r}, which seqtrain's BART does not support"
            )
    keep = _model_arg_names()
    args = argparse.Namespace(**{k: v for k, v in raw.items() if k in keep})

    if arch not in ARCHS:  # e.g. a fairseq-only bart_* variant: its explicit fields still describe it fully
        args.arch = "mbart_large" if str(arch).startswith("mbart") else "bart_large"
    return args


def model_config(args: Any) -> BartConfig:
    """The BartConfig that a stored `args` record (a checkpoint's, with fairseq's names) describes: the one
    reading of a record into the model's settings, the arch preset filling what the record leaves unset. It
    reads only: a run's record is written by seqtrain.train.program.run_record, a loaded one completed by
    complete_model_fields."""
    return arch_config(
        getattr(args, "arch", None) or "bart_base", **vars(args)
    )  # (an unknown arch: one line)


def complete_model_fields(args: Any) -> None:
    """Complete a loaded checkpoint's record as fairseq's arch functions complete the args they load: the arch
    preset fills the model fields it leaves unset, and the layer counts follow --*-layers-to-keep, so the
    record names the model built from it (the exporters and converters read it)."""
    ARCHS.get(getattr(args, "arch", None) or "bart_base")(args)
    built = as_built(model_config(args))
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_layers_to_keep", None) is not None:
            setattr(args, f"{side}_layers", getattr(built, f"{side}_layers"))


def fairseq_state_dict(
    path: str, state: dict[str, torch.Tensor], notes: list[str]
) -> dict[str, torch.Tensor]:
    """fairseq's names are ours; drop fairseq-only extras and tie output_projection where older files lack
    it."""
    out, dropped = {}, []
    for k, v in state.items():
        if k.endswith(".version") or k.endswith("_float_tensor") or k.startswith("classification_heads."):
            dropped.append(k)
        else:
            out[k] = v
    if "decoder.output_projection.weight" not in out and "decoder.embed_tokens.weight" in out:
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
        notes.append(
            "tied decoder.output_projection.weight to decoder.embed_tokens.weight (absent in the file)"
        )
    if "encoder.embed_tokens.weight" not in out and "decoder.embed_tokens.weight" in out:
        out["encoder.embed_tokens.weight"] = out["decoder.embed_tokens.weight"]
    if dropped:
        more = ", ..." if len(dropped) > 4 else ""
        notes.append(f"dropped {len(dropped)} fairseq-only entries ({', '.join(dropped[:4])}{more})")
    return out


def read_fairseq(path: str, obj: dict) -> CheckpointContents:
    """The contents of a loaded fairseq checkpoint (without its dictionaries: see find_dictionaries)."""
    if not isinstance(obj.get("model"), dict):
        raise SeqtrainError(f"{path}: fairseq checkpoint's 'model' is not a state dict")
    args = fairseq_args(path, obj)
    ck = CheckpointContents(path=path, format="fairseq", args=args, model={}, state=obj)
    ck.model = fairseq_state_dict(path, strip_wrapper_prefix(dict(obj["model"])), ck.notes)
    return ck


def find_dictionaries(
    ckpt_path: str, args: argparse.Namespace, dict_path: str | None
) -> tuple[Any, Any, dict | None]:
    """(src_dict, tgt_dict, tokenizer spec or None): `dict_path` (file or folder), else next to the
    checkpoint."""
    folder = dict_path if dict_path and os.path.isdir(dict_path) else None
    if dict_path and folder is None:
        if not os.path.isfile(dict_path):
            raise SeqtrainError(f"--dict {dict_path}: file not found")
        files = (dict_path, dict_path)
        folder = os.path.dirname(dict_path) or "."
    else:
        folder = folder or os.path.dirname(os.path.abspath(ckpt_path))
        src, tgt = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
        candidates = [(os.path.join(folder, "dict.txt"),) * 2]
        if src and tgt:
            candidates.append(
                (os.path.join(folder, f"dict.{src}.txt"), os.path.join(folder, f"dict.{tgt}.txt"))
            )
        files = next((c for c in candidates if os.path.isfile(c[0]) and os.path.isfile(c[1])), None)
        if files is None:
            where = f"--dict {dict_path}" if dict_path else f"next to {ckpt_path}"
            raise SeqtrainError(
                f"{ckpt_path}: fairseq checkpoints hold no dictionary and none was found ({where}: looked for "
                f"{', '.join(os.path.basename(c[0]) for c in candidates)}); pass --dict PATH/dict.txt"
            )
    # an mBART model's task added [lang] symbols and <mask> to dict.txt when it loaded it: so do we
    langs = getattr(args, "langs", None)
    src_dict = add_language_symbols(Dictionary.load(files[0]), langs)
    tgt_dict = src_dict if files[1] == files[0] else add_language_symbols(Dictionary.load(files[1]), langs)
    spec = None
    tok_file = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(tok_file):
        try:
            with open(tok_file, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as e:
            raise SeqtrainError(f"{tok_file}: not a readable tokenizer spec ({e})") from None
    return src_dict, tgt_dict, spec


# What fairseq 0.12 reads back from an export (fairseq/checkpoint_utils.py, fairseq/models/bart/model.py).
# Its registered BART archs; an arch function only fills args that are missing, so every dimension is
# written explicitly and a seqtrain-only size (bart_small, bart_tiny) loads as one of these.
FAIRSEQ_ARCHS = ("bart_large", "bart_base", "mbart_large", "mbart_base", "mbart_base_wmt20")
# The model args written (fairseq's names); None values are left out, so fairseq's arch function fills them
EXPORT_MODEL_ARGS = MODEL_ARG_NAMES[1 : MODEL_ARG_NAMES.index("source_lang")]
# The task args written: fields of fairseq's TranslationConfig with their types (None never written)
EXPORT_TASK_ARGS = {
    "source_lang": str,
    "target_lang": str,
    "left_pad_source": bool,
    "left_pad_target": bool,
    "truncate_source": bool,
    "langs": str,
    "max_source_positions": int,
    "max_target_positions": int,
}
# seqtrain component name -> fairseq's class name, as optimizer_history records it
FAIRSEQ_CRITERIONS = {
    "cross_entropy": "CrossEntropyCriterion",
    "label_smoothed_cross_entropy": "LabelSmoothedCrossEntropyCriterion",
}
FAIRSEQ_OPTIMIZERS = {
    "adam": "FairseqAdam",
    "nag": "FairseqNAG",
    "sgd": "SGD",
    "adafactor": "FairseqAdafactor",
}
FAIRSEQ_LR_SCHEDULERS = ("fixed", "inverse_sqrt", "polynomial_decay", "reduce_lr_on_plateau", "cosine")


def fairseq_arch(args: argparse.Namespace) -> str:
    """A fairseq-registered arch for these args: the same name when fairseq has it, else bart_/mbart_ (pre-norm
    with scaled embeddings, mBART's layout) _large or _base by width."""
    if args.arch in FAIRSEQ_ARCHS:
        return args.arch
    mbart = bool(getattr(args, "encoder_normalize_before", False)) and not getattr(
        args, "no_scale_embedding", True
    )
    size = "large" if args.encoder_embed_dim >= 1024 else "base"
    return f"{'mbart' if mbart else 'bart'}_{size}"


def export_args(args: argparse.Namespace) -> argparse.Namespace:
    """The `args` Namespace of a fairseq export: a registered arch, every model dimension explicit, the task's
    data conventions and the component names, each a value fairseq's config schema accepts (no None, nothing
    seqtrain-only)."""
    out: dict[str, Any] = {"task": "translation", "arch": fairseq_arch(args)}
    dims = {
        "decoder_output_dim": getattr(args, "decoder_embed_dim", None),
        "decoder_input_dim": getattr(args, "decoder_embed_dim", None),
    }
    for name in EXPORT_MODEL_ARGS:
        value = getattr(args, name, None)
        value = dims.get(name) if value is None else value
        if value is not None:
            out[name] = value
    for name, want in FAIRSEQ_REQUIRED:
        if want is not None:
            out[name] = want
    for name, kind in EXPORT_TASK_ARGS.items():
        value = getattr(args, name, None)
        if value is not None:
            out[name] = kind(value)
    criterion = getattr(args, "criterion", None)
    out["criterion"] = criterion if criterion in FAIRSEQ_CRITERIONS else "cross_entropy"
    if out["criterion"] == "label_smoothed_cross_entropy":
        out["label_smoothing"] = float(getattr(args, "label_smoothing", None) or 0.0)
    optimizer = getattr(args, "optimizer", None)
    out["optimizer"] = optimizer if optimizer in FAIRSEQ_OPTIMIZERS else "adam"
    scheduler = getattr(args, "lr_scheduler", None)
    out["lr_scheduler"] = scheduler if scheduler in FAIRSEQ_LR_SCHEDULERS else "fixed"
    return argparse.Namespace(**out)


def _training_names(source: dict | None) -> dict:
    """The component names (criterion, optimizer, lr scheduler, label smoothing) of a fairseq checkpoint dict,
    which seqtrain's reading keeps out of the model args."""
    names = ("criterion", "optimizer", "lr_scheduler", "label_smoothing")
    source = source or {}
    raw = source.get("args")
    cfg = source.get("cfg") if isinstance(source.get("cfg"), dict) else {}
    if raw is None and isinstance(cfg.get("model"), argparse.Namespace):
        raw = cfg["model"]
    found = {k: getattr(raw, k) for k in names if getattr(raw, k, None) is not None} if raw else {}
    for group in names[:3]:
        sub = cfg.get(group)
        if isinstance(sub, dict) and sub.get("_name"):
            found.setdefault(group, sub["_name"])
            if "label_smoothing" in sub:
                found.setdefault("label_smoothing", sub["label_smoothing"])
    return found


def _training_history(args: argparse.Namespace, source: dict | None) -> tuple[dict, dict]:
    """(optimizer_history[-1], extra_state) of an export: the names fairseq checks on restore, the update
    count and data position of `source` (the converted seqtrain or fairseq checkpoint dict), no optimizer
    state."""
    saved = TrainState.from_dict(source)
    # a fairseq source keeps its update count and best value there
    history = ((source or {}).get("optimizer_history") or [{}])[-1]
    best = saved.best if saved.says("best") else (history.get("lr_scheduler_state") or {}).get("best")
    num_updates = saved.num_updates if saved.says("num_updates") else history.get("num_updates", 0)
    entry = {
        "criterion_name": FAIRSEQ_CRITERIONS[args.criterion],
        "optimizer_name": FAIRSEQ_OPTIMIZERS[args.optimizer],
        "lr_scheduler_state": {"best": best},
        "num_updates": int(num_updates or 0),
    }
    return entry, saved.fairseq_extra_state(best)


def export_fairseq(lm: Any, path: str, write_dict: bool = True, source: dict | None = None) -> None:
    """A fairseq 0.12 checkpoint of a `seqtrain.checkpoint.load.LoadedModel` that fairseq-generate and fairseq-train
    (--restore-file, --finetune-from-model) load: `args` (see export_args), `model` with fairseq's names and
    version entries, a one-entry `optimizer_history` (criterion and optimizer class names, lr scheduler
    state, update count of `source`, the converted checkpoint's dict), no optimizer state; plus dict.txt next
    to it (fairseq keeps dictionaries outside)."""
    args = export_args(argparse.Namespace(**{**_training_names(source), **vars(lm.args)}))
    stored = getattr(lm, "generation", None)
    for name, value in (stored.settings if stored is not None else {}).items():
        # fairseq's GenerationConfig has these names: its hub interface (BARTModel.from_pretrained(...)
        # .generate/.sample) starts from the checkpoint's cfg.generation; fairseq-generate reads its flags only
        setattr(args, name, value)
    model = cpu_state(lm.model)
    model["encoder.version"] = torch.tensor([3.0])
    model["decoder.version"] = torch.tensor([3.0])
    history, extra_state = _training_history(args, source)
    state = {
        "args": args,
        "model": model,
        "optimizer_history": [history],
        EXTRA_STATE: extra_state,  # (the training state's entry: seqtrain.checkpoint.train_state)
        "last_optimizer_state": None,
    }
    # every check before any write: a conflicting dict.txt must not cost the old model.pt
    to_write = []
    if write_dict and lm.src_dict is not None:
        folder = os.path.dirname(os.path.abspath(path))
        pairs = (
            [("dict.txt", lm.src_dict)]
            if lm.src_dict == lm.tgt_dict
            else [
                (f"dict.{getattr(args, 'source_lang', None) or 'source'}.txt", lm.src_dict),
                (f"dict.{getattr(args, 'target_lang', None) or 'target'}.txt", lm.tgt_dict),
            ]
        )
        for name, d in pairs:
            target = os.path.join(folder, name)
            if not os.path.exists(target):
                to_write.append((target, d))
            elif Dictionary.load(target) != d:
                raise SeqtrainError(
                    f"{target} exists and differs from the model's dictionary; not overwriting it (nor {path}): "
                    "write to another folder or remove it"
                )
    save_checkpoint_file(state, path)
    for target, d in to_write:
        d.save(target)  # atomic, like the model


# ------------------------------------------------------------------------------- stored args: the tools' adapter
# Generation and the checkpoint tools (seqtrain-convert, the Hugging Face export, seqtrain-average-checkpoints, the
# seqtrain format) read and make a checkpoint's `args` (a Namespace with fairseq's names, any of which a file may
# leave out) through the functions below, by name; the model builder (seqtrain.checkpoint.load) takes it whole.


@dataclass(frozen=True)
class StoredConventions:
    """The data conventions a checkpoint's args record, which generation and the exports reproduce; one the
    file leaves out has fairseq's default."""

    task: str | None = None
    langs: str | None = None  # mBART's language codes (translation_from_pretrained_bart)
    source_lang: str | None = None
    target_lang: str | None = None
    prepend_bos: bool = False
    left_pad_source: bool = True
    max_source_positions: int = 1024
    max_target_positions: int = 1024


def stored_conventions(args: Any) -> StoredConventions:
    """The data conventions `args` (a checkpoint's, or a loaded model's) record."""
    out = {f.name: getattr(args, f.name, f.default) for f in fields(StoredConventions)}
    out["prepend_bos"], out["left_pad_source"] = bool(out["prepend_bos"]), bool(out["left_pad_source"])
    return StoredConventions(**out)


def set_conventions(args: Any, **values: Any) -> None:
    """Record data conventions in a checkpoint's args (generation's --langs / --task, a Hugging Face folder's
    tokenizer and source limit), by StoredConventions' names."""
    unknown = set(values) - {f.name for f in fields(StoredConventions)}
    if unknown:
        raise TypeError(f"set_conventions: not a stored convention: {', '.join(sorted(unknown))}")
    for name, value in values.items():
        setattr(args, name, value)


def stored_model_fields(args: Any) -> dict[str, Any]:
    """The model and data fields of MODEL_ARG_NAMES that `args` holds, by fairseq name (one left out of the
    file is absent): what an export writes of the model (Hugging Face's config.json)."""
    values = vars(args)
    return {k: values[k] for k in MODEL_ARG_NAMES if k in values}


@dataclass(frozen=True)
class StoredRun:
    """What a seqtrain run's stored args say of its generation settings (seqtrain-convert --to hf records them)."""

    eval_rouge: bool = False
    eval_rouge_args: Any = None  # --eval-rouge-args as given (JSON object or flags), or None
    config: Any = None  # the --config preset the run trained with, or None


def stored_run(args: Any) -> StoredRun:
    return StoredRun(
        bool(getattr(args, "eval_rouge", False)),
        getattr(args, "eval_rouge_args", None),
        getattr(args, "config", None),
    )


def stored_args(values: dict[str, Any]) -> argparse.Namespace:
    """A checkpoint's args from plain values by fairseq name (a seqtrain checkpoint's dict, a Hugging Face
    config's fields)."""
    return argparse.Namespace(**values)


def args_values(args: Any) -> dict[str, Any]:
    """A checkpoint's args (a Namespace, or a dict as seqtrain checkpoints and training configs hold them) as a
    dict by fairseq name."""
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)


def raw_model_values(obj: dict) -> dict[str, Any]:
    """The model args of a checkpoint dict as stored, unchecked: a seqtrain checkpoint's `args` dict, a fairseq
    one's `args` Namespace or its cfg['model'] (Namespace or dict); {} when it holds none."""
    args = obj.get("args")
    if args is None and isinstance(obj.get("cfg"), dict):
        args = obj["cfg"].get("model")
    if isinstance(args, (argparse.Namespace, dict)):
        return args_values(args)
    return {}


def arch_preset(arch: str) -> dict[str, Any]:
    """The fields a registered arch preset fills (its function fills a Namespace, as fairseq's arch functions)."""
    ns = argparse.Namespace()
    ARCHS.get(arch)(ns)
    return vars(ns)
