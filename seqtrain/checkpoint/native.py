"""seqtrain's own checkpoint format: the dict a training run saves and how it reads back.

The file itself is written and read by `seqtrain.checkpoint.files` (atomic save, safe load), as fairseq's and
Hugging Face's are; this module fixes what is inside: format name and version, the model args as plain data, the
state dict with fairseq's parameter names, the dictionaries as plain lists, the tokenizer spec, and the training
state a resume needs (optimizer, scheduler, loss scaler, extra_state: meters, RNG states, iterator position), whose
entries seqtrain.checkpoint.train_state's TrainState reads and writes.
"""

from __future__ import annotations

from typing import Any

import torch

from seqtrain.checkpoint.fairseq import args_values, stored_args
from seqtrain.checkpoint.files import (
    CheckpointContents,
    cpu_state,
    save_checkpoint_file,
    strip_wrapper_prefix,
)
from seqtrain.checkpoint.generation_settings import read_stored, with_stored
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.data.dictionary import Dictionary
from seqtrain.errors import SeqtrainError

FORMAT_VERSION = 1


def make_checkpoint_state(
    args: Any,
    model_state: dict[str, torch.Tensor],
    src_dict: Any = None,
    tgt_dict: Any = None,
    tokenizer: dict | None = None,
    training: TrainState | None = None,
    generation: Any = None,
) -> dict[str, Any]:
    """The seqtrain checkpoint dict (docs/design.md), plain data only so weights_only loading accepts
    it; `training`: what a resume needs besides the weights (none for a model export); `generation`: the
    generation settings it remembers (a StoredGeneration, seqtrain.checkpoint.generation_settings; none: no
    `generation` entry, as before)."""
    state = {
        "format": "seqtrain",
        "version": FORMAT_VERSION,
        "args": plain_args(args),
        "model": model_state,
        "src_dict": src_dict.to_list() if src_dict is not None else None,
        "tgt_dict": tgt_dict.to_list() if tgt_dict is not None else None,
        "tokenizer": tokenizer,
        **(training or TrainState()).to_dict(),
    }
    return with_stored(state, generation)


def plain_args(args: Any) -> dict[str, Any]:
    """A checkpoint's args (Namespace or dict) as a dict of plain values (anything exotic becomes its str), safe
    for weights_only loading."""
    items = args_values(args)

    def plain(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(plain(x) for x in v)
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return str(v)

    return {k: plain(v) for k, v in items.items() if not k.startswith("_")}


def read_seqtrain(path: str, obj: dict) -> CheckpointContents:
    """The contents of a loaded seqtrain checkpoint dict (its version and required keys checked)."""
    version = obj.get("version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise SeqtrainError(
            f"{path} has seqtrain checkpoint version {version}; this seqtrain reads up to {FORMAT_VERSION}"
        )
    for key in ("args", "model"):
        if not isinstance(obj.get(key), dict):
            raise SeqtrainError(f"{path}: seqtrain checkpoint without {key!r}")
    try:
        src = Dictionary.from_list(obj["src_dict"]) if obj.get("src_dict") is not None else None
        tgt = Dictionary.from_list(obj["tgt_dict"]) if obj.get("tgt_dict") is not None else src
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise SeqtrainError(f"{path}: malformed dictionary data ({type(e).__name__}: {e})") from None
    return CheckpointContents(
        path=path,
        format="seqtrain",
        args=stored_args(obj["args"]),
        model=strip_wrapper_prefix(dict(obj["model"])),
        src_dict=src,
        tgt_dict=tgt,
        tokenizer=obj.get("tokenizer"),
        state=obj,
        generation=read_stored(obj, path),
    )


def export_seqtrain(lm: Any, path: str) -> None:
    """A seqtrain checkpoint of a `seqtrain.checkpoint.load.LoadedModel` (model, args, dictionaries as plain lists,
    tokenizer spec, the generation settings it carries); no training state."""
    spec = lm.tokenizer_spec or (lm.tokenizer.spec() if lm.tokenizer is not None else None)
    state = make_checkpoint_state(
        lm.args,
        cpu_state(lm.model),
        lm.src_dict,
        lm.tgt_dict,
        spec,
        generation=getattr(lm, "generation", None),
    )
    save_checkpoint_file(state, path)
