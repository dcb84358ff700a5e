"""Checkpoint formats: tell which one a file or folder is, read any of them into `CheckpointContents`, and the
exporter of each (`EXPORTERS`). seqtrain's own format lives in `seqtrain.checkpoint.native`; fairseq's and Hugging
Face's in the modules beside this one."""

from __future__ import annotations

import os
from typing import Any

import torch

from seqtrain.checkpoint.adapters import BASE_KEY, check_base, read_base_record
from seqtrain.checkpoint.checks import check_contents
from seqtrain.checkpoint.fairseq import export_fairseq, find_dictionaries, read_fairseq
from seqtrain.checkpoint.files import (
    CheckpointContents,
    check_finite,
    check_still_mapped,
    load_checkpoint_file,
    mapped_identity,
    verify_checksums,
)
from seqtrain.checkpoint.hf import export_hf, read_hf
from seqtrain.checkpoint.hub import resolve_model_path
from seqtrain.checkpoint.native import export_seqtrain, read_seqtrain
from seqtrain.errors import SeqtrainError
from seqtrain.models.resize import keep_layers

FORMATS = ("seqtrain", "fairseq", "hf")
EXPORTERS = {"seqtrain": export_seqtrain, "fairseq": export_fairseq, "hf": export_hf}


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


def read_loaded(
    path: str,
    obj: Any,
    fmt: str = "auto",
    lora_base: str | None = None,
    unsafe: bool = False,
    base_flag: str = "--lora-base",
) -> CheckpointContents:
    """The contents of checkpoint file `path`, already loaded as `obj` (seqtrain or fairseq). An adapters-only
    LoRA checkpoint comes back whole: its adapters over the base model it names (or `lora_base`, the path
    `base_flag` gave), which must be the one they were trained on (seqtrain.checkpoint.adapters)."""
    found = detect_format(path, obj)
    if fmt != "auto" and fmt != found:
        raise SeqtrainError(f"{path} is a {found} checkpoint, not {fmt} (--from {fmt})")
    if found != "seqtrain":
        ck = read_fairseq(path, obj)
    else:
        ck = read_seqtrain(path, obj)
        if obj.get(BASE_KEY) is not None:
            ck = with_base(ck, lora_base, unsafe, base_flag)
    check_contents(ck)  # every field a reader (a resume too) uses, before anything is built from it
    return ck


def with_base(ck: CheckpointContents, lora_base: str | None, unsafe: bool, flag: str) -> CheckpointContents:
    """`ck` (adapters only) with the weights of its base model under the adapters; `ck.state` too, so a
    resume loads the whole model, and its lora_base names the base file actually read."""
    record = read_base_record(ck.path, ck.state[BASE_KEY])
    base_path = lora_base or record["path"]
    if not os.path.exists(base_path):
        raise SeqtrainError(
            f"{ck.path} holds LoRA adapters only and its base model {base_path} is not found: give the base "
            f"({os.path.basename(record['path'])}, sha256 {record['sha256'][:16]}...) with {flag} PATH"
        )
    base = read_checkpoint(base_path, unsafe=unsafe, require_dict=False)
    check_base(ck.path, record, base_path, base.model, flag)
    # the base as this model's layers (--*-layers-to-keep), then the adapters, which already are
    ck.model = {**keep_layers(base.model, ck.args, base_path), **ck.model}
    ck.state = {**ck.state, "model": ck.model, BASE_KEY: {**record, "path": os.path.abspath(base_path)}}
    ck.notes.append(f"LoRA adapters over the base model {base_path} (sha256 matches)")
    return ck


def read_checkpoint(
    path: str,
    fmt: str = "auto",
    dict_path: str | None = None,
    unsafe: bool = False,
    require_dict: bool = True,
    lora_base: str | None = None,
) -> CheckpointContents:
    """Read any supported checkpoint. `fmt` overrides detection; `dict_path` gives fairseq's dict.txt (a file,
    or a folder holding dict.txt or dict.{src,tgt}.txt) and replaces the dictionaries of other formats;
    `lora_base` is the base model of an adapters-only LoRA checkpoint (default: the path stored in it). A hub
    name (`org/name[@revision]`, seqtrain.checkpoint.hub) that is no local path reads the cached snapshot."""
    path = resolve_model_path(path, "checkpoint")
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
        # mapped, not read: the model's weights are copied out of it, the rest (optimizer state) never touched;
        # what is kept is checked against the archive's checksums before anything is built or written from it
        mapped = mapped_identity(path)
        obj = load_checkpoint_file(path, unsafe=unsafe, mmap=True)
        weights = obj.get("model") if isinstance(obj, dict) and isinstance(obj.get("model"), dict) else obj
        verify_checksums(path, weights, mapped)
        ck = read_loaded(path, obj, fmt, lora_base=lora_base, unsafe=unsafe)
        ck.mapped = mapped
    if dict_path is not None or (ck.format == "fairseq" and require_dict):
        ck.src_dict, ck.tgt_dict, spec = find_dictionaries(path, ck.args, dict_path)
        # a tokenizer belongs with its dictionary: the one stored with the replaced dictionary no longer
        # applies
        ck.tokenizer = spec
    if require_dict and ck.src_dict is None:
        raise SeqtrainError(f"{path}: no dictionary found; pass --dict PATH (dict.txt)")
    check_contents(ck)  # before anything is built from it
    if ck.mapped is not None:
        check_still_mapped(*ck.mapped)
    check_finite(ck.path, ck.model)
    return ck
