"""fairseq BART checkpoints: read them (model args, parameter names, dict.txt beside them) and write them."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from seqtrain.checkpoint import CheckpointContents, cpu_state, save_checkpoint_file, strip_wrapper_prefix
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError

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
        import seqtrain.models.bart  # noqa: F401  (registers the presets)
        from seqtrain.registry import ARCHS

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
    if not str(arch).startswith("bart"):
        raise SeqtrainError(
            f"{path}: fairseq architecture {arch!r} is not BART; seqtrain loads bart_* models"
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
    from seqtrain.registry import ARCHS

    if arch not in ARCHS:  # e.g. a fairseq-only bart_* variant: its explicit fields still describe it fully
        args.arch = "bart_large"
    return args


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
    ck = CheckpointContents(path=path, format="fairseq", args=args, model={})
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
    src_dict = Dictionary.load(files[0])
    tgt_dict = src_dict if files[1] == files[0] else Dictionary.load(files[1])
    spec = None
    tok_file = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(tok_file):
        try:
            with open(tok_file, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as e:
            raise SeqtrainError(f"{tok_file}: not a readable tokenizer spec ({e})") from None
    return src_dict, tgt_dict, spec


def export_fairseq(lm: Any, path: str, write_dict: bool = True) -> None:
    """A fairseq-layout model.pt of a `seqtrain.hub.LoadedModel` (`args` Namespace, `model` with fairseq names
    and version entries, as the released bart.*/model.pt files are), plus dict.txt next to it (fairseq keeps
    dictionaries outside)."""
    args = argparse.Namespace(**vars(lm.args))
    args.task = getattr(args, "task", None) or "translation"
    model = cpu_state(lm.model)
    model["encoder.version"] = torch.tensor([3.0])
    model["decoder.version"] = torch.tensor([3.0])
    state = {
        "args": args,
        "model": model,
        "optimizer_history": [],
        "extra_state": {},
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
