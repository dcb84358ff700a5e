"""Frozen weights for fine-tuning: --freeze-encoder, --freeze-embeddings, --freeze-params REGEX.

A frozen parameter has requires_grad off before the model is wrapped and the optimizer built, so autograd computes
no gradient for it (and none of the backward pass that only it needs: with the encoder frozen, the encoder's
backward does not run at all), the optimizer keeps no state for it and DDP does not all-reduce it. Names are the
state-dict names. BART ties its token embeddings: the encoder's, the decoder's and the output projection are one
tensor with --share-all-embeddings, so freezing the encoder (which holds encoder.embed_tokens) or the embeddings
freezes all three, as transformers' freeze_encoder / freeze_embeds do.
"""

from __future__ import annotations

import logging
import re

import torch

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.models.lora import is_lora_key

logger = logging.getLogger(__name__)

EMBEDDING_PATTERN = r"\.(embed_tokens|embed_positions)\.|^decoder\.output_projection\."


@settings
class FreezeConfig:
    """Fine-tuning: frozen weights"""

    freeze_encoder: bool = setting(
        False,
        "train no encoder weight (with --share-all-embeddings this freezes the shared token embeddings too)",
        action="store_true",
    )
    freeze_embeddings: bool = setting(
        False,
        "train no token or position embedding (nor the output projection tied to them)",
        action="store_true",
    )
    freeze_params: str | None = setting(
        None,
        "train no parameter whose name matches REGEX (re.search; e.g. 'decoder\\.layers\\.[0-2]\\.')",
        metavar="REGEX",
    )


def freeze(
    model: torch.nn.Module,
    encoder: bool = False,
    embeddings: bool = False,
    params: str | None = None,
    lora: bool = False,
) -> list[str]:
    """Turn requires_grad off for the chosen parameters (with `lora`, every one but the LoRA adapters); returns
    their names (every name of a tied tensor)."""
    patterns = []
    if encoder:
        patterns.append(r"^encoder\.")
    if embeddings:
        patterns.append(EMBEDDING_PATTERN)
    if params:
        try:
            re.compile(params)
        except re.error as e:
            raise SeqtrainError(f"--freeze-params '{params}': not a valid regular expression ({e})") from None
        patterns.append(params)
    if not patterns and not lora:
        return []
    named = list(model.named_parameters(remove_duplicate=False))
    if params and not any(re.search(params, n) for n, _ in named):
        raise SeqtrainError(
            f"--freeze-params '{params}' matches no parameter (names look like encoder.layers.0.fc1.weight)"
        )
    chosen = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
    frozen = {id(p) for n, p in named if (lora and not is_lora_key(n)) or (chosen and chosen.search(n))}
    for p in model.parameters():
        if id(p) in frozen:
            p.requires_grad_(False)
    tied = sorted(n for n, p in named if id(p) in frozen)
    total = sum(p.numel() for p in model.parameters())
    kept = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if not kept:
        raise SeqtrainError("--freeze-*: every parameter is frozen; nothing would train")
    logger.info(f"froze {len(frozen)} tensors ({total - kept:,} of {total:,} parameters); {kept:,} train")
    return tied
