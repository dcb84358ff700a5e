"""Checkpoint files: atomic save, safe load, and reading seqtrain, fairseq and Hugging Face BART weights.

Everything that reads a checkpoint ends in one shape, `CheckpointContents`: model args with fairseq's names, a
state dict with fairseq's parameter names (seqtrain's names are fairseq's), and the dictionaries when known.
`seqtrain.hub` builds models from it and writes the export formats.

Loading is safe by default: `torch.load(weights_only=True)` with an allowlist of the few classes that our own and
fairseq's checkpoints legitimately pickle (argparse.Namespace, numpy scalars). Anything else needs `unsafe=True`
(`--unsafe-load`), because arbitrary unpickling can run code.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
FORMATS = ("seqtrain", "fairseq", "hf")
EMBEDDING_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")


def _numpy_safe_globals() -> list:
    # fairseq stored some scalars (best loss, meters) as numpy scalars; these rebuild a number from a dtype and
    # raw bytes, nothing more. Pickles written under numpy 1 name the function numpy.core.multiarray.scalar.
    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    items: list = [scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype]
    for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType", "BoolDType"):
        cls = getattr(getattr(np, "dtypes", None), name, None)
        if cls is not None:
            items.append(cls)
    return items


SAFE_GLOBALS: list = [argparse.Namespace] + _numpy_safe_globals()


# --------------------------------------------------------------------------------------------------- file level
def save_checkpoint_file(state: Dict[str, Any], path: str) -> None:
    """torch.save `state` to `path` atomically: a crash or error mid-write leaves any old file intact."""
    with atomic_write(path, "wb") as f:
        torch.save(state, f)


def _sniff(path: str) -> None:
    """Reject what cannot be a torch checkpoint before torch gives a confusing message about it."""
    if not os.path.exists(path):
        raise SeqtrainError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        raise SeqtrainError(f"{path} is a directory, expected a checkpoint file")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise SeqtrainError(f"{path} is empty, not a checkpoint")
    # zip archive (torch >= 1.6) or the legacy format, which starts with a protocol-2 pickle of a long magic number
    if head != b"PK\x03\x04" and head[:2] != b"\x80\x02":
        raise SeqtrainError(f"{path} is not a PyTorch checkpoint (neither a torch zip archive nor a legacy torch file)")


def load_checkpoint_file(path: str, unsafe: bool = False) -> Any:
    """torch.load on CPU; with `unsafe=False` only plain data plus `SAFE_GLOBALS` may be unpickled."""
    _sniff(path)
    try:
        if unsafe:
            logger.warning(f"--unsafe-load: unpickling {path} without restrictions; code inside it can run "
                           "(use this only for files you trust)")
            return torch.load(path, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except SeqtrainError:
        raise
    except Exception as e:  # torch raises many types for damaged files; turn each into one clear line
        msg = str(e)
        if not unsafe and ("GLOBAL" in msg or "Unsupported global" in msg):
            try:
                names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            except Exception:
                names = []
            what = f" ({', '.join(names[:5])})" if names else ""
            raise SeqtrainError(
                f"{path} needs arbitrary unpickling{what}, which may run code; "
                f"if you trust this file, pass --unsafe-load (unsafe=True) to load it"
            ) from None
        if "central directory" in msg or isinstance(e, (EOFError, IndexError)) or "zip archive" in msg:
            raise SeqtrainError(f"{path} is truncated or corrupted (could not read it as a torch checkpoint)") from None
        first = msg.strip().splitlines()[0][:200] if msg.strip() else type(e).__name__
        raise SeqtrainError(f"{path} could not be read as a checkpoint: {first}") from None


# --------------------------------------------------------------------------------------------------- contents
@dataclass
class CheckpointContents:
    """A checkpoint of any supported format, translated to seqtrain's names."""

    path: str
    format: str  # "seqtrain" | "fairseq" | "hf"
    args: argparse.Namespace  # model (and data-convention) args with fairseq's names, incl. `arch`
    model: Dict[str, torch.Tensor]  # fairseq / seqtrain parameter names
    src_dict: Any = None  # seqtrain.data.dictionary.Dictionary, when known
    tgt_dict: Any = None
    tokenizer: Optional[dict] = None  # a tokenizer spec (seqtrain.data.tokenizer.build_tokenizer)
    state: Optional[dict] = None  # the whole seqtrain checkpoint dict (optimizer, extra_state...) for resuming
    notes: List[str] = field(default_factory=list)  # what was dropped or adjusted while reading


def make_checkpoint_state(
    args: argparse.Namespace | dict,
    model_state: Dict[str, torch.Tensor],
    src_dict: Any = None,
    tgt_dict: Any = None,
    tokenizer: Optional[dict] = None,
    optimizer: Any = None,
    lr_scheduler: Any = None,
    loss_scaler: Any = None,
    extra_state: Optional[dict] = None,
) -> Dict[str, Any]:
    """The seqtrain checkpoint dict (docs/internals.md), plain data only so weights_only loading accepts it."""
    return {
        "format": "seqtrain",
        "version": FORMAT_VERSION,
        "args": plain_args(args),
        "model": model_state,
        "src_dict": src_dict.to_list() if src_dict is not None else None,
        "tgt_dict": tgt_dict.to_list() if tgt_dict is not None else None,
        "tokenizer": tokenizer,
        "optimizer": optimizer,
        "lr_scheduler": lr_scheduler,
        "loss_scaler": loss_scaler,
        "extra_state": extra_state or {},
    }


def plain_args(args: argparse.Namespace | dict) -> Dict[str, Any]:
    """Args as a dict of plain values (anything exotic becomes its str), safe for weights_only loading."""
    items = vars(args) if isinstance(args, argparse.Namespace) else dict(args)

    def plain(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(plain(x) for x in v)
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return str(v)

    return {k: plain(v) for k, v in items.items() if not k.startswith("_")}


def detect_format(path: str, obj: Any = None) -> str:
    """'hf' for a Hugging Face model folder, else 'seqtrain' or 'fairseq' from the loaded checkpoint `obj`."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "config.json")):
            return "hf"
        raise SeqtrainError(f"{path} is a directory without config.json: not a Hugging Face model folder")
    if obj is None:
        raise ValueError("detect_format needs the loaded object for a checkpoint file")
    if isinstance(obj, dict) and obj.get("format") == "seqtrain":
        return "seqtrain"
    if isinstance(obj, dict) and "model" in obj and ("args" in obj or "cfg" in obj):
        return "fairseq"
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        if any(k.startswith(("model.encoder.", "model.shared.")) for k in obj):
            raise SeqtrainError(
                f"{path} looks like Hugging Face weights; pass the folder holding it and its config.json instead"
            )
        raise SeqtrainError(f"{path} is a bare state dict without model args; cannot tell its architecture")
    raise SeqtrainError(f"{path} is not a seqtrain, fairseq or Hugging Face BART checkpoint")


def read_checkpoint(
    path: str,
    fmt: str = "auto",
    dict_path: Optional[str] = None,
    unsafe: bool = False,
    require_dict: bool = True,
) -> CheckpointContents:
    """Read any supported checkpoint. `fmt` overrides detection; `dict_path` gives fairseq's dict.txt (a file, or
    a folder holding dict.txt or dict.{src,tgt}.txt) and replaces the dictionaries of other formats."""
    if fmt not in ("auto",) + FORMATS:
        raise SeqtrainError(f"--from must be one of auto, {', '.join(FORMATS)}; got {fmt!r}")
    if not os.path.exists(path):
        raise SeqtrainError(f"checkpoint not found: {path}")
    if os.path.isdir(path) or fmt == "hf":
        if fmt not in ("auto", "hf"):
            raise SeqtrainError(f"{path} is a directory; --from {fmt} expects a checkpoint file")
        folder = path if os.path.isdir(path) else (os.path.dirname(path) or ".")
        detect_format(folder)
        ck = read_hf(folder)
    else:
        obj = load_checkpoint_file(path, unsafe=unsafe)
        found = detect_format(path, obj)
        if fmt != "auto" and fmt != found:
            raise SeqtrainError(f"{path} is a {found} checkpoint, not {fmt} (--from {fmt})")
        ck = _read_seqtrain(path, obj) if found == "seqtrain" else _read_fairseq(path, obj)
    if dict_path is not None or (ck.format == "fairseq" and require_dict):
        ck.src_dict, ck.tgt_dict, spec = find_dictionaries(path, ck.args, dict_path)
        # a tokenizer belongs with its dictionary: the one stored with the replaced dictionary no longer applies
        ck.tokenizer = spec
    if require_dict and ck.src_dict is None:
        raise SeqtrainError(f"{path}: no dictionary found; pass --dict PATH (dict.txt)")
    return ck


def _strip_wrapper_prefix(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    # DDP ("module.") and torch.compile ("_orig_mod.") wrappers leak into names when saved without unwrapping
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def _read_seqtrain(path: str, obj: dict) -> CheckpointContents:
    from seqtrain.data.dictionary import Dictionary

    version = obj.get("version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SeqtrainError(
            f"{path} has seqtrain checkpoint version {version}; this seqtrain reads up to {FORMAT_VERSION}"
        )
    for key in ("args", "model"):
        if not isinstance(obj.get(key), dict):
            raise SeqtrainError(f"{path}: seqtrain checkpoint without {key!r}")
    src = Dictionary.from_list(obj["src_dict"]) if obj.get("src_dict") is not None else None
    tgt = Dictionary.from_list(obj["tgt_dict"]) if obj.get("tgt_dict") is not None else src
    return CheckpointContents(
        path=path, format="seqtrain", args=argparse.Namespace(**obj["args"]),
        model=_strip_wrapper_prefix(dict(obj["model"])), src_dict=src, tgt_dict=tgt,
        tokenizer=obj.get("tokenizer"), state=obj,
    )


# --------------------------------------------------------------------------------------------------- fairseq
# Model fields copied from a fairseq checkpoint's args; the arch preset's own fields are added to these at runtime.
MODEL_ARG_NAMES = (
    "arch", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_layers", "encoder_attention_heads",
    "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
    "decoder_output_dim", "decoder_input_dim", "max_source_positions", "max_target_positions",
    "dropout", "attention_dropout", "activation_dropout", "relu_dropout", "activation_fn",
    "share_all_embeddings", "share_decoder_input_output_embed", "no_scale_embedding", "layernorm_embedding",
    "encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "decoder_learned_pos",
    "encoder_layerdrop", "decoder_layerdrop", "pooler_activation_fn", "pooler_dropout",
    # data conventions generation must reproduce
    "source_lang", "target_lang", "left_pad_source", "left_pad_target", "truncate_source", "prepend_bos",
)

# (field, value seqtrain's BART implements): a checkpoint with another value would load but compute differently
FAIRSEQ_REQUIRED = (
    ("layernorm_embedding", True),
    ("encoder_learned_pos", True), ("decoder_learned_pos", True), ("no_token_positional_embeddings", False),
    ("adaptive_softmax_cutoff", None), ("adaptive_input", False), ("cross_self_attention", False),
    ("no_cross_attention", False), ("encoder_layers_to_keep", None), ("decoder_layers_to_keep", None),
    ("quant_noise_pq", 0), ("tie_adaptive_weights", False),
)


def _model_arg_names() -> set:
    names = set(MODEL_ARG_NAMES)
    try:
        from seqtrain.registry import ARCHS
        import seqtrain.models.bart  # noqa: F401  (registers the presets)

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
    raw: Dict[str, Any] = {}
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
        raise SeqtrainError(f"{path}: fairseq checkpoint without model args (neither 'args' nor cfg['model'])")
    arch = raw.get("arch") or raw.get("_name")
    if not arch:
        raise SeqtrainError(f"{path}: fairseq checkpoint args name no architecture ('arch')")
    if not str(arch).startswith("bart"):
        raise SeqtrainError(f"{path}: fairseq architecture {arch!r} is not BART; seqtrain loads bart_* models")
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


def fairseq_state_dict(path: str, state: Dict[str, torch.Tensor], notes: List[str]) -> Dict[str, torch.Tensor]:
    """fairseq's names are ours; drop fairseq-only extras and tie output_projection where older files lack it."""
    out, dropped = {}, []
    for k, v in state.items():
        if k.endswith(".version") or k.endswith("_float_tensor") or k.startswith("classification_heads."):
            dropped.append(k)
        else:
            out[k] = v
    if "decoder.output_projection.weight" not in out and "decoder.embed_tokens.weight" in out:
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
        notes.append("tied decoder.output_projection.weight to decoder.embed_tokens.weight (absent in the file)")
    if "encoder.embed_tokens.weight" not in out and "decoder.embed_tokens.weight" in out:
        out["encoder.embed_tokens.weight"] = out["decoder.embed_tokens.weight"]
    if dropped:
        more = ", ..." if len(dropped) > 4 else ""
        notes.append(f"dropped {len(dropped)} fairseq-only entries ({', '.join(dropped[:4])}{more})")
    return out


def _read_fairseq(path: str, obj: dict) -> CheckpointContents:
    if not isinstance(obj.get("model"), dict):
        raise SeqtrainError(f"{path}: fairseq checkpoint's 'model' is not a state dict")
    args = fairseq_args(path, obj)
    ck = CheckpointContents(path=path, format="fairseq", args=args, model={})
    ck.model = fairseq_state_dict(path, _strip_wrapper_prefix(dict(obj["model"])), ck.notes)
    return ck


def find_dictionaries(
    ckpt_path: str, args: argparse.Namespace, dict_path: Optional[str]
) -> Tuple[Any, Any, Optional[dict]]:
    """(src_dict, tgt_dict, tokenizer spec or None): `dict_path` (file or folder), else next to the checkpoint."""
    from seqtrain.data.dictionary import Dictionary

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
            candidates.append((os.path.join(folder, f"dict.{src}.txt"), os.path.join(folder, f"dict.{tgt}.txt")))
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


# --------------------------------------------------------------------------------------------------- Hugging Face
HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}
# Old (transformers < 4) BART configs describe mBART-style variants with these switches.
HF_REQUIRED = (
    ("normalize_before", False), ("add_final_layer_norm", False), ("static_position_embeddings", False),
    ("normalize_embedding", True), ("add_bias_logits", False), ("extra_pos_embeddings", 2),
    ("pad_token_id", 1),
)


def hf_config_to_args(config: dict, where: str) -> argparse.Namespace:
    """A Hugging Face BartConfig (as a dict) -> seqtrain model args with fairseq's names."""
    if config.get("model_type") != "bart":
        raise SeqtrainError(f"{where}: not a BART config (model_type {config.get('model_type')!r}, expected 'bart')")
    for name, want in HF_REQUIRED:
        if name in config and config[name] != want:
            raise SeqtrainError(f"{where}: {name}={config[name]!r} is not supported (seqtrain's BART needs {want!r})")
    act = config.get("activation_function", "gelu")
    if act not in HF_ACTIVATIONS:
        raise SeqtrainError(
            f"{where}: activation_function {act!r} is not supported (use one of {', '.join(HF_ACTIVATIONS)})"
        )
    if config.get("tie_word_embeddings", True) is False:
        raise SeqtrainError(f"{where}: tie_word_embeddings=false is not supported (seqtrain ties the embeddings)")
    d = int(config.get("d_model", 1024))
    max_pos = int(config.get("max_position_embeddings", 1024))
    fields = dict(
        encoder_embed_dim=d, decoder_embed_dim=d, decoder_output_dim=d, decoder_input_dim=d,
        encoder_layers=int(config.get("encoder_layers", 12)), decoder_layers=int(config.get("decoder_layers", 12)),
        encoder_ffn_embed_dim=int(config.get("encoder_ffn_dim", 4096)),
        decoder_ffn_embed_dim=int(config.get("decoder_ffn_dim", 4096)),
        encoder_attention_heads=int(config.get("encoder_attention_heads", 16)),
        decoder_attention_heads=int(config.get("decoder_attention_heads", 16)),
        max_source_positions=max_pos, max_target_positions=max_pos,
        dropout=float(config.get("dropout", 0.1)), attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)), activation_fn=HF_ACTIVATIONS[act],
        no_scale_embedding=not config.get("scale_embedding", False),
        share_all_embeddings=True, share_decoder_input_output_embed=True, layernorm_embedding=True,
        encoder_normalize_before=False, decoder_normalize_before=False,
        encoder_layerdrop=float(config.get("encoder_layerdrop", 0.0)),
        decoder_layerdrop=float(config.get("decoder_layerdrop", 0.0)),
        # HF BART tokenizers put <s> first in both sequences; seqtrain's --prepend-bos does the same
        prepend_bos=True,
    )
    return argparse.Namespace(arch=_closest_arch(fields), **fields)


def _closest_arch(fields: dict) -> str:
    """The preset whose sizes match (only a label: every size is also set explicitly)."""
    from seqtrain.registry import ARCHS
    import seqtrain.models.bart  # noqa: F401

    keys = ("encoder_embed_dim", "encoder_layers", "encoder_ffn_embed_dim", "encoder_attention_heads")
    for arch in ARCHS.names():
        ns = argparse.Namespace()
        ARCHS.get(arch)(ns)
        if all(getattr(ns, k, None) == fields[k] for k in keys):
            return arch
    return "bart_large"


def args_to_hf_config(args: argparse.Namespace, vocab_size: int, pad: int = 1, bos: int = 0, eos: int = 2) -> dict:
    """seqtrain model args -> a Hugging Face BartConfig dict (for BartForConditionalGeneration)."""
    g = lambda k, d=None: getattr(args, k, d)  # noqa: E731
    if g("encoder_embed_dim") != g("decoder_embed_dim"):
        raise SeqtrainError("Hugging Face BART needs encoder_embed_dim == decoder_embed_dim")
    if g("max_source_positions", 1024) != g("max_target_positions", 1024):
        raise SeqtrainError("Hugging Face BART needs max_source_positions == max_target_positions")
    act = g("activation_fn", "gelu")
    if act not in HF_ACTIVATIONS.values():
        raise SeqtrainError(f"activation_fn {act!r} has no Hugging Face BART equivalent here (gelu or relu)")
    for name, want in (("encoder_normalize_before", False), ("decoder_normalize_before", False),
                       ("layernorm_embedding", True)):
        if g(name, want) != want:
            raise SeqtrainError(f"{name}={g(name)!r} has no Hugging Face BART equivalent")
    return {
        "model_type": "bart", "architectures": ["BartForConditionalGeneration"],
        "vocab_size": int(vocab_size), "d_model": int(g("encoder_embed_dim")),
        "max_position_embeddings": int(g("max_source_positions", 1024)),
        "encoder_layers": int(g("encoder_layers")), "decoder_layers": int(g("decoder_layers")),
        "encoder_ffn_dim": int(g("encoder_ffn_embed_dim")), "decoder_ffn_dim": int(g("decoder_ffn_embed_dim")),
        "encoder_attention_heads": int(g("encoder_attention_heads")),
        "decoder_attention_heads": int(g("decoder_attention_heads")),
        "activation_function": act, "dropout": float(g("dropout", 0.1)),
        "attention_dropout": float(g("attention_dropout", 0.0)),
        "activation_dropout": float(g("activation_dropout", 0.0)),
        "encoder_layerdrop": float(g("encoder_layerdrop", 0.0) or 0.0),
        "decoder_layerdrop": float(g("decoder_layerdrop", 0.0) or 0.0),
        "scale_embedding": not g("no_scale_embedding", True), "init_std": 0.02,
        "pad_token_id": pad, "bos_token_id": bos, "eos_token_id": eos,
        "decoder_start_token_id": eos, "forced_eos_token_id": eos,
        "is_encoder_decoder": True, "tie_word_embeddings": True, "use_cache": True,
    }


def hf_state_to_seqtrain(state: Dict[str, torch.Tensor], where: str, notes: List[str]) -> Dict[str, torch.Tensor]:
    """Hugging Face BART names -> fairseq / seqtrain names. Below `model.` the layer names are already fairseq's;
    the embedding (model.shared, tied to lm_head) becomes the three tied fairseq embeddings."""
    out: Dict[str, torch.Tensor] = {}
    embeds: Dict[str, torch.Tensor] = {}
    dropped = []
    for k, v in state.items():
        name = k[len("model."):] if k.startswith("model.") else k
        if name == "final_logits_bias":
            # seqtrain's output layer has no bias; a zero bias (every released BART) changes nothing
            if torch.count_nonzero(v).item():
                raise SeqtrainError(
                    f"{where}: final_logits_bias is nonzero; seqtrain's BART has no output bias, "
                    "so its logits would differ"
                )
            continue
        if name in ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
            embeds[name] = v
        elif name.startswith(("encoder.layer_norm.", "decoder.layer_norm.")):
            raise SeqtrainError(f"{where}: has a final {name.split('.')[0]} layer_norm (mBART-style); not a BART model")
        elif name.startswith(("encoder.", "decoder.")):
            out[name] = v
        else:
            dropped.append(k)  # classification / QA heads
    if not embeds:
        raise SeqtrainError(f"{where}: no token embedding (model.shared.weight) in the weights")
    order = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
    emb = next(embeds[n] for n in order if n in embeds)
    for n, t in embeds.items():
        if t.shape != emb.shape or not torch.equal(t, emb):
            raise SeqtrainError(f"{where}: {n} differs from model.shared.weight; seqtrain needs tied embeddings")
    for k in EMBEDDING_KEYS:
        out[k] = emb
    if dropped:
        notes.append(f"dropped {len(dropped)} non-BART-LM entries ({', '.join(dropped[:4])})")
    return out


def seqtrain_state_to_hf(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The inverse mapping, one copy of the tied embedding (safetensors refuses shared storage)."""
    out = {"model.shared.weight": state["encoder.embed_tokens.weight"].contiguous().clone()}
    for k, v in state.items():
        if k in EMBEDDING_KEYS:
            continue
        out["model." + k] = v.contiguous().clone()
    shared = out["model.shared.weight"]
    out["final_logits_bias"] = torch.zeros(1, shared.shape[0], dtype=shared.dtype)
    return out


def _load_hf_weights(folder: str) -> Tuple[Dict[str, torch.Tensor], str]:
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    st, index, binf = (os.path.join(folder, n) for n in names)
    try:
        if os.path.isfile(st) or os.path.isfile(index):
            from safetensors.torch import load_file

            if os.path.isfile(st):
                return load_file(st, device="cpu"), st
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state: Dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(os.path.join(folder, shard), device="cpu"))
            return state, index
    except SeqtrainError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SeqtrainError(f"{folder}: could not read the safetensors weights ({first})") from None
    if os.path.isfile(binf):
        obj = load_checkpoint_file(binf)
        if not isinstance(obj, dict):
            raise SeqtrainError(f"{binf} is not a state dict")
        return obj, binf
    raise SeqtrainError(f"{folder}: no model.safetensors or pytorch_model.bin found")


def read_hf(folder: str) -> CheckpointContents:
    """A Hugging Face BART folder (config.json + model.safetensors or pytorch_model.bin)."""
    cfg_path = os.path.join(folder, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise SeqtrainError(f"{cfg_path} not found: not a Hugging Face model folder") from None
    except ValueError as e:
        raise SeqtrainError(f"{cfg_path}: invalid JSON ({e})") from None
    args = hf_config_to_args(config, cfg_path)
    state, weights_path = _load_hf_weights(folder)
    ck = CheckpointContents(path=folder, format="hf", args=args, model={})
    ck.model = hf_state_to_seqtrain(state, weights_path, ck.notes)
    ck.src_dict, ck.tokenizer = _hf_dictionary(folder, ck.model["encoder.embed_tokens.weight"].shape[0])
    ck.tgt_dict = ck.src_dict
    return ck


def placeholder_dictionary(rows: int, tokens: Optional[List[Optional[str]]] = None) -> Any:
    """A Dictionary of `rows` symbols: the four specials, then `tokens[i]` where given, else madeupwordNNNN (the
    names fairseq pads dictionaries with). Used where a checkpoint carries no dictionary and none is needed."""
    from seqtrain.data.dictionary import Dictionary

    d = Dictionary()
    tokens = tokens or [None] * rows
    for i in range(len(d), rows):
        tok = tokens[i] if i < len(tokens) else None
        if tok is None or tok in d or not tok or any(c.isspace() for c in tok):
            tok = f"madeupword{i:04d}"
        d.add_symbol(tok)
    return d


def _hf_bpe_files(folder: str) -> Tuple[Optional[dict], Optional[str]]:
    """(vocab token -> id, merges text) from vocab.json + merges.txt, else from a BPE tokenizer.json."""
    names = ("vocab.json", "merges.txt", "tokenizer.json")
    vocab_file, merges_file, tok_file = (os.path.join(folder, n) for n in names)
    try:
        if os.path.isfile(vocab_file):
            with open(vocab_file, encoding="utf-8") as f:
                vocab = json.load(f)
            merges = None
            if os.path.isfile(merges_file):
                with open(merges_file, encoding="utf-8", newline="") as f:
                    merges = f.read()
            return vocab, merges
        if os.path.isfile(tok_file):
            with open(tok_file, encoding="utf-8") as f:
                model = json.load(f).get("model") or {}
            if model.get("type") == "BPE" and isinstance(model.get("vocab"), dict):
                pairs = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
                return model["vocab"], "#version: 0.2\n" + "\n".join(pairs) + "\n"
    except (OSError, ValueError) as e:
        raise SeqtrainError(f"{folder}: unreadable tokenizer files ({e})") from None
    return None, None


def _hf_dictionary(folder: str, rows: int) -> Tuple[Any, Optional[dict]]:
    """(Dictionary, gpt2 tokenizer spec or None) for an HF folder. Dictionary index i is HF token id i; with the
    BPE files its symbols are the ids as decimal strings (fairseq's GPT-2 convention, with HF's vocab.json as the
    id table), so seqtrain's gpt2 tokenizer built from vocab.json + merges.txt encodes text to these indices."""
    vocab, merges = _hf_bpe_files(folder)
    if not vocab:
        return placeholder_dictionary(rows), None
    names: List[Optional[str]] = [None] * rows
    for tok, i in vocab.items():
        if isinstance(i, int) and 4 <= i < rows:
            names[i] = tok if tok == "<mask>" else str(i)
    spec = None
    if merges is not None:
        from seqtrain.data.tokenizer import GPT2BPETokenizer

        try:
            spec = GPT2BPETokenizer(json.dumps(vocab, ensure_ascii=False), merges).spec()
        except SeqtrainError as e:
            raise SeqtrainError(f"{folder}: {e}") from None
    return placeholder_dictionary(rows, names), spec


# --------------------------------------------------------------------------------------------------- vocab, fit
def resize_embeddings(
    state: Dict[str, torch.Tensor],
    src_size: int,
    tgt_size: int,
    padding_idx: int = 1,
    init: str = "mean",
    where: str = "checkpoint",
    seed: int = 0,
) -> Dict[str, torch.Tensor]:
    """Make the embedding rows match the dictionaries: extra rows (bart.base's padded 51201 rows, bart.large's
    <mask>) are cut; missing rows are appended, initialized to the mean of the existing rows (init="mean", so new
    tokens start with average logits) or normal(0, 0.02) (init="normal"); a new padding row is zero. Tied
    tensors stay tied. Logs one line when anything changed."""
    if init not in ("mean", "normal"):
        raise ValueError(f"init must be 'mean' or 'normal', got {init!r}")
    wanted = {"encoder.embed_tokens.weight": src_size, "decoder.embed_tokens.weight": tgt_size,
              "decoder.output_projection.weight": tgt_size}
    out = dict(state)
    done: Dict[Tuple[int, Tuple[int, ...], int], torch.Tensor] = {}
    changes: List[Tuple[str, int, int]] = []
    gen = torch.Generator().manual_seed(seed)
    new_rows_cache: Dict[Tuple[int, int], torch.Tensor] = {}
    for key, size in wanted.items():
        t = state.get(key)
        if t is None or t.shape[0] == size:
            continue
        ident = (t.data_ptr(), tuple(t.shape), size)
        if ident not in done:
            old = t.shape[0]
            if size < old:
                new = t[:size].clone()
            else:
                if init == "mean":
                    keep = torch.ones(old, dtype=torch.bool)
                    if padding_idx < old:
                        keep[padding_idx] = False
                    extra = t[keep].float().mean(0, keepdim=True).expand(size - old, -1).to(t.dtype)
                else:
                    cache_key = (size - old, t.shape[1])
                    if cache_key not in new_rows_cache:
                        new_rows_cache[cache_key] = torch.randn(size - old, t.shape[1], generator=gen) * 0.02
                    extra = new_rows_cache[cache_key].to(t.dtype)
                new = torch.cat([t, extra], 0)
                if old <= padding_idx < size:
                    new[padding_idx].zero_()
            done[ident] = new
        out[key] = done[ident]
        changes.append((key.rsplit(".", 1)[0], t.shape[0], size))
    if changes:
        parts = []
        for (name, old, new) in changes:
            how = f"truncated {old - new} rows" if new < old else f"added {new - old} rows ({init} init)"
            parts.append(f"{name} {old}->{new} ({how})")
        logger.info(f"{where}: resized vocabulary embeddings to the dictionary: {'; '.join(parts)}")
    return out


POSITION_KEYS = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")


def fit_positions(state: Dict[str, torch.Tensor], model: torch.nn.Module, where: str) -> Dict[str, torch.Tensor]:
    """Cut learned position rows the model does not use (e.g. --max-source-positions 256 when fine-tuning
    bart.base, which has 1024): positions are absolute, so the first rows are the ones kept. Logs one line."""
    expected = model.state_dict()
    out, cut = dict(state), []
    for key in POSITION_KEYS:
        if key in state and key in expected and state[key].shape[0] > expected[key].shape[0]:
            rows = expected[key].shape[0]
            out[key] = state[key][:rows].clone()
            cut.append(f"{key.split('.')[0]} {state[key].shape[0]}->{rows}")
    if cut:
        logger.info(f"{where}: kept the first positions of the learned position embeddings ({'; '.join(cut)} "
                    f"rows), as --max-source-positions / --max-target-positions ask")
    return out


def check_state_fits(model: torch.nn.Module, state: Dict[str, torch.Tensor], where: str) -> None:
    """Raise a SeqtrainError listing the first mismatching names and shapes, if `state` does not fit `model`."""
    expected = model.state_dict()
    for key in POSITION_KEYS:
        if key in state and key in expected and state[key].shape[0] < expected[key].shape[0]:
            side = key.split(".")[0]
            usable = state[key].shape[0] - 2  # fairseq's offset: padding index + 1 rows come first
            raise SeqtrainError(
                f"{where}: the checkpoint has learned positions for {usable} {side} tokens, fewer than the model "
                f"asks for; pass --max-{'source' if side == 'encoder' else 'target'}-positions {usable} or less")
    shapes = [f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}"
              for k, v in expected.items() if k in state and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if not (shapes or missing or unexpected):
        return
    parts = []
    for label, items in (("shape mismatch", shapes), ("missing", missing), ("unexpected", unexpected)):
        if items:
            more = f" (+{len(items) - 4} more)" if len(items) > 4 else ""
            parts.append(f"{label}: {', '.join(items[:4])}{more}")
    raise SeqtrainError(f"{where}: weights do not fit the model architecture: {'; '.join(parts)}")
