"""Build and load a BART model from any supported checkpoint (writing one: `seqtrain.checkpoint.formats.EXPORTERS`).

    >>> from seqtrain.checkpoint.load import load_model
    >>> lm = load_model("checkpoints/checkpoint_best.pt")                      # seqtrain
    >>> lm = load_model("bart.base/model.pt", dict_path="bart.base/dict.txt")  # fairseq
    >>> lm = load_model("hf-bart-folder/")  # Hugging Face (config.json + weights)
    >>> logits, extra = lm.model(src_tokens, src_lengths, prev_output_tokens)   # B x T x V

Embedding rows are fitted to the dictionary (see `seqtrain.models.resize.resize_embeddings`), so fairseq's
bart.base (51201 padded rows) and bart.large (an extra <mask> row) load with the plain 50264-symbol dict.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.init

from seqtrain.checkpoint.checks import check_arch_overrides, check_model_args
from seqtrain.checkpoint.fairseq import complete_model_fields, model_config
from seqtrain.checkpoint.files import CheckpointContents, check_still_mapped
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.data.tokenizer import build_tokenizer
from seqtrain.errors import SeqtrainError
from seqtrain.models.bart import build_model
from seqtrain.models.lora import merge_lora
from seqtrain.models.resize import (
    EMBEDDING_KEYS,
    check_state_fits,
    fill_adapters,
    fit_positions,
    keep_layers,
    resize_embeddings,
)

logger = logging.getLogger("seqtrain.hub")  # the name log lines have always shown

# the help of --lora-base, a flag of every program that loads a checkpoint (--resize-vocab's: options.py)
LORA_BASE_HELP = (
    "the base model of an adapters-only LoRA checkpoint (--save-adapters-only), when it is no longer at the "
    "path stored in it; its weights must be the ones the adapters were trained on (checked by sha256)"
)


@dataclass
class LoadedModel:
    model: torch.nn.Module  # BARTModel in eval mode
    args: argparse.Namespace  # complete model args (preset filled)
    src_dict: Any
    tgt_dict: Any
    tokenizer: Any = None  # seqtrain.data.tokenizer.Tokenizer, when the checkpoint or data-bin has one
    format: str = "seqtrain"  # the format it was read from
    tokenizer_spec: dict | None = None  # the plain spec `tokenizer` was built from
    # the generation settings the checkpoint carries (seqtrain.checkpoint.generation_settings), or None
    generation: Any = None

    def __iter__(self):  # unpacks as (model, args, src_dict, tgt_dict, tokenizer), as docs/design.md says
        return iter((self.model, self.args, self.src_dict, self.tgt_dict, self.tokenizer))


_INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def _weights_left_uninitialized() -> Iterator[None]:
    """Within it, torch.nn.init's functions (which nn.Linear, nn.Embedding, nn.LayerNorm and seqtrain's own
    initializations call) return their tensor as allocated. For a model whose every weight is loaded next,
    drawing random weights first only costs time: bart_base's 140 M on the 2-core development CPU, 1.9 s of a
    15 s `seqtrain-generate --bf16` run over 256 sentences (bart_large: about 3x that). The functions are
    patched module-wide while it runs, as transformers' no_init_weights does: another thread initializing a
    model at that moment would get uninitialized weights."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    with _INIT_LOCK:
        saved = {n: getattr(torch.nn.init, n) for n in names}
        for n in names:
            setattr(torch.nn.init, n, _return_tensor)
        try:
            yield
        finally:
            for n, f in saved.items():
                setattr(torch.nn.init, n, f)


def _return_tensor(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def build_from_contents(
    ck: CheckpointContents,
    arch_overrides: dict[str, Any] | None = None,
    embed_init: str = "mean",
    resize_vocab: bool = False,
) -> torch.nn.Module:
    """Build the model `ck.args` describes for `ck`'s dictionaries and load its weights (resized to fit; beyond
    fairseq's padding only with `resize_vocab`). The model is built without drawing initial weights: the strict
    load below sets every one of them."""
    if arch_overrides:
        check_arch_overrides(ck.args, arch_overrides)
        for k, v in arch_overrides.items():
            setattr(ck.args, k, v)
        check_model_args(ck.args, ck.model, "--model-overrides")  # dimensions that fit the stored weights
    cfg = model_config(ck.args)  # (an unknown arch: one line, before the record is completed)
    complete_model_fields(ck.args)
    with _weights_left_uninitialized():
        model = build_model(cfg, ck.src_dict, ck.tgt_dict)
    state = resize_embeddings(
        keep_layers(ck.model, ck.args, ck.path),
        len(ck.src_dict),
        len(ck.tgt_dict),
        padding_idx=ck.src_dict.pad(),
        init=embed_init,
        where=ck.path,
        allow_any=resize_vocab,
    )
    if not getattr(ck.args, "share_all_embeddings", True):
        # separate embeddings: the file's tied tensors are copied into each
        state = {k: (v.clone() if k in EMBEDDING_KEYS else v) for k, v in state.items()}
    state = fill_adapters(fit_positions(state, model, ck.path), model, ck.path)
    check_state_fits(model, state, ck.path)
    if ck.mapped is not None:  # the copy below reads the mapping
        check_still_mapped(*ck.mapped)
    model.load_state_dict(state, strict=True)
    return model


def load_model(
    path: str,
    dict_path: str | None = None,
    arch_overrides: dict[str, Any] | None = None,
    unsafe: bool = False,
    device: str | torch.device = "cpu",
    fmt: str = "auto",
    resize_vocab: bool = False,
    lora_base: str | None = None,
) -> LoadedModel:
    """Load a seqtrain checkpoint, a fairseq checkpoint (dictionary from `dict_path` or dict.txt next to it)
    or a Hugging Face BART folder, as an eval-mode model on `device`.

    `arch_overrides` (e.g. {"dropout": 0.2}) replaces the checkpoint's model args; `unsafe=True` allows
    arbitrary unpickling for trusted files that need it (fairseq checkpoints with custom classes);
    `resize_vocab=True` fits the embedding to a dictionary of any size (--resize-vocab); `lora_base` is the
    base model of an adapters-only LoRA checkpoint (default: the path stored in it).

    Example:
        >>> lm = load_model("checkpoint_last.pt", dict_path="data-bin/dict.src.txt")
        >>> lm.model(src_tokens, src_lengths, prev_output_tokens)[0].shape   # B x T x len(lm.tgt_dict)
    """
    ck = read_checkpoint(path, fmt=fmt, dict_path=dict_path, unsafe=unsafe, lora_base=lora_base)
    return model_from_contents(ck, arch_overrides, device, resize_vocab)


def model_from_contents(
    ck: CheckpointContents,
    arch_overrides: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    resize_vocab: bool = False,
) -> LoadedModel:
    """load_model's second half, for callers that read (and adjusted) the checkpoint contents themselves."""
    for note in ck.notes:
        logger.info(f"{ck.path}: {note}")
    model = build_from_contents(ck, arch_overrides, resize_vocab=resize_vocab)
    # generation and inference: adapters folded into their weights, one matrix each
    if merge_lora(model):
        ck.args.lora_rank = 0  # the record exports save: the model has no adapters left
    model = model.to(device).eval()
    tokenizer = None
    if ck.tokenizer:
        try:
            tokenizer = build_tokenizer(ck.tokenizer)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise SeqtrainError(f"{ck.path}: unusable tokenizer data ({type(e).__name__}: {e})") from None
    return LoadedModel(
        model, ck.args, ck.src_dict, ck.tgt_dict, tokenizer, ck.format, ck.tokenizer, ck.generation
    )
