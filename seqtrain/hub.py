"""Load a BART model from any supported checkpoint, and write it out as seqtrain, fairseq or Hugging Face files.

    >>> from seqtrain.hub import load_model
    >>> lm = load_model("checkpoints/checkpoint_best.pt")                  # seqtrain
    >>> lm = load_model("bart.base/model.pt", dict_path="bart.base/dict.txt")  # fairseq
    >>> lm = load_model("hf-bart-folder/")                                 # Hugging Face (config.json + weights)
    >>> logits, extra = lm.model(src_tokens, src_lengths, prev_output_tokens)   # B x T x V

Embedding rows are fitted to the dictionary (see `seqtrain.checkpoint.resize_embeddings`), so fairseq's
bart.base (51201 padded rows) and bart.large (an extra <mask> row) load with the plain 50264-symbol dict.txt.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from seqtrain.checkpoint import (
    EMBEDDING_KEYS,
    CheckpointContents,
    args_to_hf_config,
    check_state_fits,
    fit_positions,
    make_checkpoint_state,
    read_checkpoint,
    resize_embeddings,
    save_checkpoint_file,
    seqtrain_state_to_hf,
)
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module  # BARTModel in eval mode
    args: argparse.Namespace  # complete model args (preset filled)
    src_dict: Any
    tgt_dict: Any
    tokenizer: Any = None  # seqtrain.data.tokenizer.Tokenizer, when the checkpoint or data-bin has one
    format: str = "seqtrain"  # the format it was read from
    tokenizer_spec: Optional[dict] = None  # the plain spec `tokenizer` was built from

    def __iter__(self):  # unpacks as (model, args, src_dict, tgt_dict, tokenizer), as docs/internals.md says
        return iter((self.model, self.args, self.src_dict, self.tgt_dict, self.tokenizer))


def build_from_contents(
    ck: CheckpointContents,
    arch_overrides: Optional[Dict[str, Any]] = None,
    embed_init: str = "mean",
) -> torch.nn.Module:
    """Build the model `ck.args` describes for `ck`'s dictionaries and load its weights (resized to fit)."""
    from seqtrain.models.bart import build_model

    for k, v in (arch_overrides or {}).items():
        setattr(ck.args, k, v)
    model = build_model(ck.args, ck.src_dict, ck.tgt_dict)
    state = resize_embeddings(
        ck.model, len(ck.src_dict), len(ck.tgt_dict), padding_idx=ck.src_dict.pad(), init=embed_init, where=ck.path
    )
    if not getattr(ck.args, "share_all_embeddings", True):
        # separate embeddings: the file's tied tensors are copied into each
        state = {k: (v.clone() if k in EMBEDDING_KEYS else v) for k, v in state.items()}
    state = fit_positions(state, model, ck.path)
    check_state_fits(model, state, ck.path)
    model.load_state_dict(state, strict=True)
    return model


def load_model(
    path: str,
    dict_path: Optional[str] = None,
    arch_overrides: Optional[Dict[str, Any]] = None,
    unsafe: bool = False,
    device: str | torch.device = "cpu",
    fmt: str = "auto",
) -> LoadedModel:
    """Load a seqtrain checkpoint, a fairseq checkpoint (dictionary from `dict_path` or dict.txt next to it) or a
    Hugging Face BART folder, as an eval-mode model on `device`.

    `arch_overrides` (e.g. {"dropout": 0.2}) replaces the checkpoint's model args; `unsafe=True` allows arbitrary
    unpickling for trusted files that need it (fairseq checkpoints with custom classes).

    Example:
        >>> lm = load_model("checkpoint_last.pt", dict_path="data-bin/dict.src.txt")
        >>> lm.model(src_tokens, src_lengths, prev_output_tokens)[0].shape   # B x T x len(lm.tgt_dict)
    """
    ck = read_checkpoint(path, fmt=fmt, dict_path=dict_path, unsafe=unsafe)
    return model_from_contents(ck, arch_overrides, device)


def model_from_contents(ck: CheckpointContents, arch_overrides: Optional[Dict[str, Any]] = None,
                        device: str | torch.device = "cpu") -> LoadedModel:
    """load_model's second half, for callers that read (and adjusted) the checkpoint contents themselves."""
    for note in ck.notes:
        logger.info(f"{ck.path}: {note}")
    model = build_from_contents(ck, arch_overrides).to(device).eval()
    tokenizer = None
    if ck.tokenizer:
        from seqtrain.data.tokenizer import build_tokenizer

        tokenizer = build_tokenizer(ck.tokenizer)
    return LoadedModel(model, ck.args, ck.src_dict, ck.tgt_dict, tokenizer, ck.format, ck.tokenizer)


# --------------------------------------------------------------------------------------------------- export
def _cpu_state(model_or_state: torch.nn.Module | Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    state = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) else model_or_state
    return {k: v.detach().cpu() for k, v in state.items()}


def export_seqtrain(lm: LoadedModel, path: str) -> None:
    """A seqtrain checkpoint (model, args, dictionaries as plain lists, tokenizer spec); no training state."""
    spec = lm.tokenizer_spec or (lm.tokenizer.spec() if lm.tokenizer is not None else None)
    state = make_checkpoint_state(lm.args, _cpu_state(lm.model), lm.src_dict, lm.tgt_dict, spec)
    save_checkpoint_file(state, path)


def export_fairseq(lm: LoadedModel, path: str, write_dict: bool = True) -> None:
    """A fairseq-layout model.pt (`args` Namespace, `model` with fairseq names and version entries, as the
    released bart.*/model.pt files are), plus dict.txt next to it (fairseq keeps dictionaries outside)."""
    args = argparse.Namespace(**vars(lm.args))
    args.task = getattr(args, "task", None) or "translation"
    model = _cpu_state(lm.model)
    model["encoder.version"] = torch.tensor([3.0])
    model["decoder.version"] = torch.tensor([3.0])
    state = {"args": args, "model": model, "optimizer_history": [], "extra_state": {}, "last_optimizer_state": None}
    save_checkpoint_file(state, path)
    if write_dict and lm.src_dict is not None:
        folder = os.path.dirname(os.path.abspath(path))
        pairs = [("dict.txt", lm.src_dict)] if lm.src_dict == lm.tgt_dict else [
            (f"dict.{getattr(args, 'source_lang', None) or 'source'}.txt", lm.src_dict),
            (f"dict.{getattr(args, 'target_lang', None) or 'target'}.txt", lm.tgt_dict)]
        for name, d in pairs:
            target = os.path.join(folder, name)
            if os.path.exists(target):
                from seqtrain.data.dictionary import Dictionary

                if Dictionary.load(target) != d:
                    raise SeqtrainError(f"{target} exists and differs from the model's dictionary; not overwriting it")
                continue
            d.save(target)


def export_hf(lm: LoadedModel, folder: str) -> None:
    """A Hugging Face folder (config.json + model.safetensors) that
    transformers.BartForConditionalGeneration.from_pretrained loads."""
    from safetensors.torch import save as st_save

    if not getattr(lm.args, "share_all_embeddings", True):
        raise SeqtrainError("Hugging Face BART shares one embedding; this model has --no-share-all-embeddings")
    state = _cpu_state(lm.model)
    vocab = state["encoder.embed_tokens.weight"].shape[0]
    d = lm.src_dict
    ids = dict(pad=d.pad(), bos=d.bos(), eos=d.eos()) if d is not None else {}
    config = args_to_hf_config(lm.args, vocab, **ids)
    os.makedirs(folder, exist_ok=True)
    blob = st_save(seqtrain_state_to_hf(state), metadata={"format": "pt"})
    with atomic_write(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(blob)
    with atomic_write(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


EXPORTERS = {"seqtrain": export_seqtrain, "fairseq": export_fairseq, "hf": export_hf}
