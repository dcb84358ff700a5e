"""How seqtrain's model layout maps onto a Hugging Face BART / mBART folder that other engines (transformers,
CTranslate2's ct2-transformers-converter) read as it is: the layout switches released configs carry, one size for
both learned position tables, and the source limit carried as the tokenizer's model_max_length."""

from __future__ import annotations

import torch

from seqtrain.checkpoint.fairseq import set_conventions, stored_conventions
from seqtrain.checkpoint.files import CheckpointContents
from seqtrain.checkpoint.hf_files import read_model_max_length
from seqtrain.models.resize import POSITION_KEYS, POSITION_OFFSET, extend_positions


def layout_keys(mbart: bool, eos_start: bool) -> dict:
    """The layout switches released BART and mBART configs carry (transformers' current classes no longer read
    them): CTranslate2's converter reads `normalize_before` for both, `normalize_embedding` too. Its mBART loader
    starts decoding at the language token the caller passes unless the config names a `tokenizer_class`; a
    model without --langs starts at </s>, so it names the class tokenizer_config.json names."""
    keys = {
        "normalize_before": mbart,
        "add_final_layer_norm": mbart,
        "normalize_embedding": True,
        "static_position_embeddings": False,
        "add_bias_logits": False,
    }
    if not mbart:
        keys["extra_pos_embeddings"] = 2
    elif eos_start:
        keys["tokenizer_class"] = "PreTrainedTokenizerFast"
    return keys


def pad_positions(state: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """Both learned position tables at `rows` rows (Hugging Face BART has one size for both): the shorter one is
    extended as seqtrain's own --max-source/target-positions extends it (rows copied after themselves). The
    extra rows are never used when sources are cut at the source limit (model_max_length, CTranslate2's
    max_input_length) and generation stops at the target limit (generation_config.json's max_length)."""
    out = dict(state)
    for key in POSITION_KEYS:
        if key in out and out[key].shape[0] < rows:
            out[key] = extend_positions(out[key], rows)
    return out


def source_limit(folder: str, ck: CheckpointContents) -> None:
    """A tokenizer whose model_max_length is below max_position_embeddings cuts sources there (with
    truncation=True); seqtrain's exports of models with fewer source than target positions say so that way.
    The model then has that many source positions, its encoder table cut to them."""
    limit = read_model_max_length(folder)
    if limit is None or not 2 <= limit < stored_conventions(ck.args).max_source_positions:
        return
    key = POSITION_KEYS[0]
    set_conventions(ck.args, max_source_positions=limit)
    if key in ck.model:
        ck.model[key] = ck.model[key][: limit + POSITION_OFFSET].clone()
    ck.notes.append(f"source positions {limit}, the tokenizer's model_max_length (tokenizer_config.json)")
