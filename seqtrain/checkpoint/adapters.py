"""LoRA checkpoints that hold the adapters only (--save-adapters-only), and how they meet their base model again.

A LoRA run trains a few MB of adapters over a frozen base of hundreds of MB; writing the unchanged base into every
checkpoint costs disk and time for nothing (peft's adapter_model.safetensors, torchtune's adapter checkpoints keep
it out too). Such a file is a seqtrain checkpoint like any other (args with the LoRA settings, dictionaries,
tokenizer, the optimizer state of the adapters, scheduler, meters, RNG states, data position: a resume stays
exact) except that "model" holds only the NAME.lora_A / NAME.lora_B tensors and "lora_base" names the base:
{"path": its absolute path, "sha256": a fingerprint of its weights}. Every reader (resume, generation, Summarizer,
seqtrain-convert) re-reads the base, checks the fingerprint and lays the adapters over it, so what is built from
the file is what the full checkpoint would have built.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

from seqtrain.errors import SeqtrainError
from seqtrain.models.lora import is_lora_key

BASE_KEY = "lora_base"


def weights_fingerprint(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the base weights (every tensor but LoRA adapters: name, dtype, shape and bytes, in name
    order), so a base with one changed value, or one another file holds, is told apart."""
    h = hashlib.sha256()
    for name in sorted(k for k in state if not is_lora_key(k)):
        t = state[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.contiguous().reshape(-1).cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def base_record(path: str, state: dict[str, torch.Tensor]) -> dict[str, str]:
    """What an adapters-only checkpoint stores about the base model read from `path`."""
    return {"path": os.path.abspath(path), "sha256": weights_fingerprint(state)}


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA adapters of a model state dict (what an adapters-only checkpoint keeps)."""
    adapters = {k: v for k, v in state.items() if is_lora_key(k)}
    if not adapters:
        raise SeqtrainError("--save-adapters-only: the model has no LoRA adapters (give --lora-rank R)")
    return adapters


def read_base_record(where: str, record: Any) -> dict[str, str]:
    """The checked "lora_base" entry of checkpoint `where`."""
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("path", "sha256")):
        raise SeqtrainError(f"{where}: malformed lora_base entry (expected a base path and its sha256)")
    return record


def check_base(where: str, record: dict[str, str], base_path: str, base_state: dict, flag: str) -> None:
    """The base read from `base_path` must be the one the adapters in `where` were trained on."""
    found = weights_fingerprint(base_state)
    if found != record["sha256"]:
        raise SeqtrainError(
            f"{where}: its LoRA adapters were trained on a base model whose weights have sha256 "
            f"{record['sha256'][:16]}..., but {base_path} has {found[:16]}...: give the base they were trained "
            f"on ({record['path']}) with {flag} PATH"
        )
