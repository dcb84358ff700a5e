"""Hugging Face BART folders: read and write config.json, the weights (safetensors or pytorch_model.bin) and
the tokenizer files.

Why one module: import and export are the two directions of one mapping (config keys, weight names, the
tokenizer's special tokens); kept side by side, a key added to one side is seen missing on the other, and the
round-trip tests read one file."""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as st_save

import seqtrain.models.bart  # noqa: F401  (registers the bart_* archs in ARCHS)
from seqtrain.checkpoint.fairseq import (
    arch_preset,
    set_conventions,
    stored_args,
    stored_conventions,
    stored_model_fields,
)
from seqtrain.checkpoint.files import CheckpointContents, cpu_state, load_checkpoint_file, verify_checksums
from seqtrain.checkpoint.hf_files import (
    GENERATION_DEFAULTS,
    decoder_start,
    export_tokenizer,
    hf_generation_config,
    model_card,
    read_spm_tokenizer,
    read_tokenizer_json,
    tokenizer_prepends_bos,
)
from seqtrain.checkpoint.hf_layout import layout_keys, pad_positions, source_limit
from seqtrain.data.dictionary import placeholder_dictionary
from seqtrain.data.tokenizer import GPT2BPETokenizer
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write, loads_bounded
from seqtrain.flag_bounds import check_value
from seqtrain.models.resize import EMBEDDING_KEYS, POSITION_OFFSET
from seqtrain.registry import ARCHS

HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}
HF_MODEL_TYPES = ("bart", "mbart")
# Old (transformers < 4) BART configs describe mBART-style variants with these switches.
HF_REQUIRED = (
    ("normalize_before", False),
    ("add_final_layer_norm", False),
    ("static_position_embeddings", False),
    ("normalize_embedding", True),
    ("add_bias_logits", False),
    ("extra_pos_embeddings", 2),
    ("pad_token_id", 1),
)


def hf_config_to_args(config: dict, where: str) -> Any:
    """A Hugging Face BartConfig or MBartConfig (as a dict) -> seqtrain model args with fairseq's names. mBART is
    BART with pre-norm layers and a final layer norm after each stack (fairseq's --encoder-normalize-before
    --decoder-normalize-before); its tokenizer puts no <s> first. Made as a checkpoint's args
    (seqtrain.checkpoint.fairseq.stored_args)."""
    mbart = config.get("model_type") == "mbart"
    if config.get("model_type") not in HF_MODEL_TYPES:
        raise SeqtrainError(
            f"{where}: not a BART or mBART config (model_type {config.get('model_type')!r}, expected "
            "'bart' or 'mbart')"
        )
    for name, want in HF_REQUIRED if not mbart else HF_REQUIRED[-1:]:  # mBART: the pad id only
        if name in config and config[name] != want:
            raise SeqtrainError(
                f"{where}: {name}={config[name]!r} is not supported (seqtrain's BART needs {want!r})"
            )
    act = config.get("activation_function", "gelu")
    if act not in HF_ACTIVATIONS:
        raise SeqtrainError(
            f"{where}: activation_function {act!r} is not supported (use one of {', '.join(HF_ACTIVATIONS)})"
        )
    if config.get("tie_word_embeddings", True) is False:
        raise SeqtrainError(
            f"{where}: tie_word_embeddings=false is not supported (seqtrain ties the embeddings)"
        )
    d = int(config.get("d_model", 1024))
    max_pos = int(config.get("max_position_embeddings", 1024))
    fields = dict(
        encoder_embed_dim=d,
        decoder_embed_dim=d,
        decoder_output_dim=d,
        decoder_input_dim=d,
        encoder_layers=int(config.get("encoder_layers", 12)),
        decoder_layers=int(config.get("decoder_layers", 12)),
        encoder_ffn_embed_dim=int(config.get("encoder_ffn_dim", 4096)),
        decoder_ffn_embed_dim=int(config.get("decoder_ffn_dim", 4096)),
        encoder_attention_heads=int(config.get("encoder_attention_heads", 16)),
        decoder_attention_heads=int(config.get("decoder_attention_heads", 16)),
        max_source_positions=max_pos,
        max_target_positions=max_pos,
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        activation_fn=HF_ACTIVATIONS[act],
        no_scale_embedding=not config.get("scale_embedding", False),
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        layernorm_embedding=True,
        encoder_normalize_before=mbart,
        decoder_normalize_before=mbart,
        encoder_layerdrop=float(config.get("encoder_layerdrop", 0.0)),
        decoder_layerdrop=float(config.get("decoder_layerdrop", 0.0)),
        # HF BART tokenizers put <s> first in both sequences; seqtrain's --prepend-bos does the same. mBART's
        # put none (tokens </s> [lang_code]).
        prepend_bos=not mbart,
    )
    return stored_args({"arch": _closest_arch(fields), **fields})


def _closest_arch(fields: dict) -> str:
    """The preset whose sizes and layout match (only a label: every size is also set explicitly)."""
    keys = ("encoder_embed_dim", "encoder_layers", "encoder_ffn_embed_dim", "encoder_attention_heads")
    keys += ("encoder_normalize_before", "no_scale_embedding")
    presets = []
    for arch in ARCHS.names():
        if not ARCHS.get(arch).__module__.startswith("seqtrain."):
            continue  # a --user-dir plugin's preset: the label must not depend on which plugins a process loaded
        preset = arch_preset(arch)
        if all(preset.get(k) == fields[k] for k in keys):
            return arch
        presets.append((arch, preset))
    # none matches: the preset of this layout with the nearest width (a 32-dim model was labelled bart_large)
    layout = [(a, p) for a, p in presets if all(p.get(k) == fields[k] for k in keys[4:])] or presets
    return min(layout, key=lambda p: abs(p[1]["encoder_embed_dim"] - fields["encoder_embed_dim"]))[0]


def args_to_hf_config(
    args: Any,
    vocab_size: int,
    pad: int = 1,
    bos: int = 0,
    eos: int = 2,
    start: int | None = None,
) -> dict:
    """seqtrain model args (a checkpoint's, or a run's) -> a Hugging Face BartConfig dict (for
    BartForConditionalGeneration), or an MBartConfig dict for pre-norm models (mBART's layout)."""
    g = stored_model_fields(args).get
    if g("encoder_embed_dim") != g("decoder_embed_dim"):
        raise SeqtrainError("Hugging Face BART needs encoder_embed_dim == decoder_embed_dim")
    act = g("activation_fn", "gelu")
    if act not in HF_ACTIVATIONS.values():
        raise SeqtrainError(f"activation_fn {act!r} has no Hugging Face BART equivalent here (gelu or relu)")
    if g("layernorm_embedding", True) is not True:
        raise SeqtrainError(
            f"layernorm_embedding={g('layernorm_embedding')!r} has no Hugging Face BART equivalent"
        )
    mbart = bool(g("encoder_normalize_before", False))
    if bool(g("decoder_normalize_before", False)) != mbart:
        raise SeqtrainError(
            "Hugging Face BART and mBART need encoder_normalize_before == decoder_normalize_before (post-norm "
            "BART or pre-norm mBART)"
        )
    eos_start = start is None or start == eos
    return {
        **layout_keys(mbart, eos_start),
        "model_type": "mbart" if mbart else "bart",
        "architectures": ["MBartForConditionalGeneration" if mbart else "BartForConditionalGeneration"],
        "vocab_size": int(vocab_size),
        "d_model": int(g("encoder_embed_dim")),
        # one size for both learned tables: the larger (export_hf pads the other); the source limit travels as the
        # tokenizer's model_max_length
        "max_position_embeddings": max(
            int(g("max_source_positions", 1024)), int(g("max_target_positions", 1024))
        ),
        "encoder_layers": int(g("encoder_layers")),
        "decoder_layers": int(g("decoder_layers")),
        "encoder_ffn_dim": int(g("encoder_ffn_embed_dim")),
        "decoder_ffn_dim": int(g("decoder_ffn_embed_dim")),
        "encoder_attention_heads": int(g("encoder_attention_heads")),
        "decoder_attention_heads": int(g("decoder_attention_heads")),
        "activation_function": act,
        "dropout": float(g("dropout", 0.1)),
        "attention_dropout": float(g("attention_dropout", 0.0)),
        "activation_dropout": float(g("activation_dropout", 0.0)),
        "encoder_layerdrop": float(g("encoder_layerdrop", 0.0) or 0.0),
        "decoder_layerdrop": float(g("decoder_layerdrop", 0.0) or 0.0),
        "scale_embedding": not g("no_scale_embedding", True),
        "init_std": 0.02,
        "pad_token_id": pad,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "decoder_start_token_id": eos if start is None else start,
        "forced_eos_token_id": eos,
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "use_cache": True,
    }


def hf_state_to_seqtrain(
    state: dict[str, torch.Tensor], where: str, notes: list[str], mbart: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face BART names -> fairseq / seqtrain names. Below `model.` the layer names are already
    fairseq's (mBART's final encoder.layer_norm / decoder.layer_norm too); the embedding (model.shared, tied to
    lm_head) becomes the three tied fairseq embeddings."""
    out: dict[str, torch.Tensor] = {}
    embeds: dict[str, torch.Tensor] = {}
    dropped = []
    for k, v in state.items():
        name = k[len("model.") :] if k.startswith("model.") else k
        if name == "final_logits_bias":
            # seqtrain's output layer has no bias; a zero bias (every released BART) changes nothing
            if torch.count_nonzero(v).item():
                raise SeqtrainError(
                    f"{where}: final_logits_bias is nonzero; seqtrain's BART has no output bias, "
                    "so its logits would differ"
                )
            continue
        if name in (
            "shared.weight",
            "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight",
            "lm_head.weight",
        ):
            embeds[name] = v
        elif name.startswith(("encoder.layer_norm.", "decoder.layer_norm.")) and not mbart:
            raise SeqtrainError(
                f"{where}: has a final {name.split('.')[0]} layer_norm (mBART-style); not a BART model"
            )
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
            raise SeqtrainError(
                f"{where}: {n} differs from model.shared.weight; seqtrain needs tied embeddings"
            )
    for k in EMBEDDING_KEYS:
        out[k] = emb
    if dropped:
        notes.append(f"dropped {len(dropped)} non-BART-LM entries ({', '.join(dropped[:4])})")
    return out


def seqtrain_state_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse mapping, one copy of the tied embedding (safetensors refuses shared storage)."""
    out = {"model.shared.weight": state["encoder.embed_tokens.weight"].contiguous().clone()}
    for k, v in state.items():
        if k in EMBEDDING_KEYS:
            continue
        out["model." + k] = v.contiguous().clone()
    shared = out["model.shared.weight"]
    out["final_logits_bias"] = torch.zeros(1, shared.shape[0], dtype=shared.dtype)
    return out


def _shard_scope(folder: str) -> str:
    """Where the shards of the model in `folder` may live: the folder itself, or for a Hugging Face hub cache
    snapshot (`models--ORG--NAME/snapshots/REV/`, whose files are symbolic links into `../../blobs/`) the
    cache's repository folder `models--ORG--NAME`, two levels above the snapshot."""
    root = os.path.realpath(folder)
    snapshots, repo = os.path.dirname(root), os.path.dirname(os.path.dirname(root))
    if os.path.basename(snapshots) == "snapshots" and os.path.isdir(os.path.join(repo, "blobs")):
        return repo
    return root


def _index_shards(folder: str, index: str) -> list[str]:
    """The shard files named by `model.safetensors.index.json`. Each name must be relative, without `..`,
    and lead (symbolic links followed) to a regular file inside `_shard_scope(folder)`: no absolute path, no
    link leading out, no FIFO or device that would hang or read anything."""
    with open(index, encoding="utf-8") as f:
        data = json.load(f)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise SeqtrainError(f"{index}: no weight_map of tensor name -> shard file name")
    scope = _shard_scope(folder)
    shards = []
    for name in sorted(set(weight_map.values())):
        if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/") or "\0" in name:
            raise SeqtrainError(f"{index}: shard {name!r} is outside the model folder {folder}; refusing it")
        path = os.path.realpath(os.path.join(folder, name))
        if os.path.commonpath([scope, path]) != scope:
            raise SeqtrainError(
                f"{index}: shard {name!r} is outside the model folder {scope} (it leads to {path}); refusing it"
            )
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except OSError as e:
            raise SeqtrainError(f"{index}: shard {name!r}: {e.strerror}") from None
        if not regular:
            raise SeqtrainError(f"{index}: shard {name!r} is not a regular file; refusing it")
        shards.append(path)
    return shards


def _load_hf_weights(folder: str) -> tuple[dict[str, torch.Tensor], str]:
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    st, index, binf = (os.path.join(folder, n) for n in names)
    try:
        if os.path.isfile(st) or os.path.isfile(index):
            if os.path.isfile(st):
                return load_file(st, device="cpu"), st
            state: dict[str, torch.Tensor] = {}
            for shard in _index_shards(folder, index):
                state.update(load_file(shard, device="cpu"))
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
        verify_checksums(binf, obj)
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
    if not isinstance(config, dict):
        raise SeqtrainError(f"{cfg_path}: expected a JSON object, got a {type(config).__name__}")
    try:
        args = hf_config_to_args(config, cfg_path)
    except (TypeError, ValueError) as e:
        raise SeqtrainError(f"{cfg_path}: malformed value ({e})") from None
    state, weights_path = _load_hf_weights(folder)
    ck = CheckpointContents(path=folder, format="hf", args=args, model={})
    mbart = bool(stored_model_fields(args)["encoder_normalize_before"])
    ck.model = hf_state_to_seqtrain(state, weights_path, ck.notes, mbart=mbart)
    ck.src_dict, ck.tokenizer = _hf_dictionary(folder, ck.model["encoder.embed_tokens.weight"].shape[0])
    ck.tgt_dict = ck.src_dict
    bos_first = tokenizer_prepends_bos(folder)
    if bos_first is not None:  # a tokenizer.json says what a source looks like (seqtrain's exports do)
        set_conventions(ck.args, prepend_bos=bos_first)
    source_limit(folder, ck)
    return ck


def _hf_bpe_files(folder: str) -> tuple[dict | None, str | None]:
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


def _hf_dictionary(folder: str, rows: int) -> tuple[Any, dict | None]:
    """(Dictionary, gpt2 tokenizer spec or None) for an HF folder. Dictionary index i is HF token id i; with
    the BPE files its symbols are the ids as decimal strings (fairseq's GPT-2 convention, with HF's vocab.json
    as the id table), so seqtrain's gpt2 tokenizer built from vocab.json + merges.txt encodes text to these
    indices."""
    names, spm_spec = read_spm_tokenizer(folder)  # a sentencepiece export of seqtrain's: spm.model beside it
    if names is None:  # its tokenizer.json alone (saved again by transformers), or another non-GPT-2 one
        names, spm_spec = read_tokenizer_json(folder)
    if names is not None:
        return placeholder_dictionary(rows, names), spm_spec
    vocab, merges = _hf_bpe_files(folder)
    if not vocab:
        return placeholder_dictionary(rows), None
    names: list[str | None] = [None] * rows
    for tok, i in vocab.items():
        if isinstance(i, int) and 4 <= i < rows:
            names[i] = tok if tok == "<mask>" else str(i)
    spec = None
    if merges is not None:
        try:
            spec = GPT2BPETokenizer(json.dumps(vocab, ensure_ascii=False), merges).spec()
        except SeqtrainError as e:
            raise SeqtrainError(f"{folder}: {e}") from None
    return placeholder_dictionary(rows, names), spec


def export_hf(
    lm: Any, folder: str, generation: dict[str, Any] | None = None, sources: dict | None = None
) -> dict:
    """A Hugging Face folder of a `seqtrain.checkpoint.load.LoadedModel` that transformers loads whole:
    config.json + model.safetensors (BartForConditionalGeneration), the tokenizer files (AutoTokenizer, for
    gpt2 and sentencepiece models), generation_config.json from `generation` (seqtrain generation settings,
    GENERATION_DEFAULTS where absent; `sources` names where each came from, for the model card) and README.md.
    Returns what export_tokenizer did."""
    if not stored_model_fields(lm.args).get("share_all_embeddings", True):
        raise SeqtrainError(
            "Hugging Face BART shares one embedding; this model has --no-share-all-embeddings"
        )
    state = cpu_state(lm.model)
    vocab = state["encoder.embed_tokens.weight"].shape[0]
    d = lm.src_dict
    ids = (
        dict(pad=d.pad(), bos=d.bos(), eos=d.eos(), start=decoder_start(lm.args, d)) if d is not None else {}
    )
    config = args_to_hf_config(lm.args, vocab, **ids)
    config["torch_dtype"] = str(state["encoder.embed_tokens.weight"].dtype).removeprefix("torch.")
    settings = {**GENERATION_DEFAULTS, **(generation or {})}
    gen = hf_generation_config(lm.args, d, settings)
    os.makedirs(folder, exist_ok=True)
    state = pad_positions(state, config["max_position_embeddings"] + POSITION_OFFSET)
    blob = st_save(seqtrain_state_to_hf(state), metadata={"format": "pt"})
    with atomic_write(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(blob)
    with atomic_write(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    spec = lm.tokenizer_spec or (lm.tokenizer.spec() if lm.tokenizer is not None else None)
    stored = stored_conventions(lm.args)
    tok = {}
    if d is not None and len(d) == vocab:
        tok = export_tokenizer(
            folder,
            spec,
            d,
            stored.prepend_bos,
            int(stored.max_source_positions),
        )
    with atomic_write(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")
    card = model_card(
        lm, config, gen, tok, sources or dict.fromkeys(settings, "seqtrain-generate's defaults"), folder
    )
    with atomic_write(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
        f.write(card)
    return tok


# generation_config.json key -> (seqtrain generation flag, value conversion). HF lengths count the decoder start
# token (max_length = tokens before </s> + 2, min_length = min tokens before </s> + 1); *_new_tokens do not.
_HF_GENERATION_KEYS = {
    "num_beams": ("beam", int),
    "length_penalty": ("lenpen", float),
    "max_length": ("max_len_b", lambda v: int(v) - 2),
    "max_new_tokens": ("max_len_b", lambda v: int(v) - 1),
    "min_length": ("min_len", lambda v: max(int(v) - 1, 0)),
    "min_new_tokens": ("min_len", int),
    "no_repeat_ngram_size": ("no_repeat_ngram_size", int),
    "do_sample": ("sampling", bool),
    "top_k": ("sampling_topk", int),
    "top_p": ("sampling_topp", float),
    "temperature": ("temperature", float),
}


def generation_key(dest: str) -> str:
    """The generation_config.json key(s) of a seqtrain generation flag: max_length/max_new_tokens for max_len_b."""
    return "/".join(k for k, (d, _) in _HF_GENERATION_KEYS.items() if d == dest) or dest


def read_generation_config(folder: str) -> tuple[dict[str, Any], Any, str | None]:
    """The generation defaults a Hugging Face folder ships, as seqtrain flag values, with transformers'
    semantics: (flag dest -> value, the forced first token id (None: none; False: the folder does not say),
    the file they came from). From generation_config.json, else the generation keys of config.json (as
    transformers' GenerationConfig.from_model_config); keys the folder does not set are left out."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = loads_bounded(f.read())  # nesting bounded: json.load would end in a RecursionError
    except (OSError, ValueError) as e:
        raise SeqtrainError(f"{path}: cannot read the generation settings ({e})") from None
    if not isinstance(config, dict):
        raise SeqtrainError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {}
    for key, (dest, conv) in _HF_GENERATION_KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) != (conv is bool) or not isinstance(value, (int, float)):
            raise SeqtrainError(f"{path}: {key}={value!r} is not a valid value")
        if not math.isfinite(value) or value < 0:
            raise SeqtrainError(f"{path}: {key}={value!r} is not a valid value")
        if (
            key in ("max_length", "min_length")
            and config.get(key.replace("length", "new_tokens")) is not None
        ):
            continue  # as in transformers, *_new_tokens wins
        out[dest] = conv(value)
        if dest == "max_len_b" and out[dest] < 1:
            raise SeqtrainError(f"{path}: {key}={value!r} leaves no room for a token")
        try:  # the command line's ranges (num_beams: 1000000 reached 8 GB; length_penalty: 1e308 a traceback)
            check_value(dest, out[dest])
        except argparse.ArgumentTypeError as e:
            raise SeqtrainError(
                f"{path}: {key}={value!r} is out of range for --{dest.replace('_', '-')} ({e})"
            ) from None
    if out.get("sampling"):
        out["beam"] = 1  # plain sampling (transformers' beam-sample has no seqtrain counterpart)
        if out.get("sampling_topp", 1.0) >= 1.0:
            out.pop("sampling_topp", None)
        if out.get("sampling_topk", 0) <= 0:
            out.pop("sampling_topk", None)
    else:
        for dest in ("sampling", "sampling_topk", "sampling_topp", "temperature"):
            out.pop(dest, None)
    forced_bos = config["forced_bos_token_id"] if "forced_bos_token_id" in config else False
    if forced_bos not in (None, False) and (
        isinstance(forced_bos, bool) or not isinstance(forced_bos, int) or forced_bos < 0
    ):
        raise SeqtrainError(
            f"{path}: forced_bos_token_id={forced_bos!r} is not a token id (an integer >= 0, or null)"
        )
    return out, forced_bos, path


def ctranslate2_options(folder: str) -> dict[str, Any]:
    """The search options of CTranslate2's `Translator.translate_batch` for the generation settings a folder
    ships: a `seqtrain-convert --to hf` export, or a CTranslate2 model converted from one with
    `ct2-transformers-converter --copy_files generation_config.json` (CTranslate2's model format has no place
    for search defaults: translate_batch takes them from its caller). Settings the folder does not name keep
    seqtrain-generate's defaults; the mapping is docs/finetune.md's ("Serving with CTranslate2")."""
    found, _, _ = read_generation_config(folder)
    s = {**GENERATION_DEFAULTS, **{k: v for k, v in found.items() if k in GENERATION_DEFAULTS}}
    return {
        "beam_size": int(s["beam"]),
        "length_penalty": float(s["lenpen"]),
        "max_decoding_length": int(s["max_len_b"]) + 1,  # CTranslate2 counts the </s>
        "min_decoding_length": int(s["min_len"]),
        "no_repeat_ngram_size": int(s["no_repeat_ngram_size"]),
    }
