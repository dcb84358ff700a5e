"""seqtrain-convert: turn a seqtrain, fairseq or Hugging Face BART checkpoint into another of these formats.

seqtrain-convert bart.base/model.pt bart-base-hf --to hf
seqtrain-convert bart.base/model.pt bart-base.pt --to seqtrain --dict bart.base/dict.txt
seqtrain-convert checkpoints/checkpoint_best.pt export/model.pt --to fairseq
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
from typing import Any

import torch

from seqtrain.checkpoint.fairseq import export_fairseq, fairseq_arch, stored_model_fields, stored_run
from seqtrain.checkpoint.formats import EXPORTERS, FORMATS, read_checkpoint
from seqtrain.checkpoint.generation_settings import STORED, StoredGeneration, make_stored
from seqtrain.checkpoint.hf import GENERATION_DEFAULTS, export_hf, read_generation_config
from seqtrain.checkpoint.hub import resolve_model_path
from seqtrain.checkpoint.load import LORA_BASE_HELP, LoadedModel, build_from_contents
from seqtrain.checkpoint.options import RESIZE_VOCAB_HELP
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.config import setting, settings
from seqtrain.data.dictionary import placeholder_dictionary
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import check_outputs_apart, folder_files
from seqtrain.flag_bounds import Bounds, check_value
from seqtrain.logging import setup_logging
from seqtrain.models.lora import merge_lora

logger = logging.getLogger("seqtrain.convert")


@settings
class ConvertConfig:
    """seqtrain-convert"""

    input: str = setting(
        None,
        "checkpoint file (seqtrain / fairseq), Hugging Face model folder, or hub name org/name[@revision]",
        flags="input",
    )
    output: str = setting(None, "output file (--to seqtrain / fairseq) or folder (--to hf)", flags="output")
    to: str = setting(None, "output format", required=True, choices=FORMATS)
    ema: bool = setting(
        False,
        "export the EMA of the weights a --store-ema run kept (extra_state['ema']) instead of the weights",
        action="store_true",
    )
    from_format: str = setting(
        "auto", "input format (default: detect)", flags="--from", choices=("auto",) + FORMATS
    )
    dict_path: str | None = setting(
        None,
        "dict.txt (or a data-bin folder) for fairseq inputs; default: dict.txt next to the input",
        flags="--dict",
        metavar="PATH",
    )
    unsafe_load: bool = setting(
        False,
        "allow arbitrary unpickling of the input (may run code; only for trusted files)",
        action="store_true",
    )
    resize_vocab: bool = setting(False, RESIZE_VOCAB_HELP, action="store_true")
    lora_base: str | None = setting(None, LORA_BASE_HELP, metavar="PATH")
    dtype: str | None = setting(
        None,
        "store the weights in this type (default: as they are; float16 halves the file, as the released "
        "models ship; seqtrain, fairseq and transformers load them into float32 models)",
        choices=("float32", "float16", "bfloat16"),
    )
    debug: bool = setting(False, "show tracebacks", action="store_true")


@settings
class HfGenerationConfig:
    """the generation settings an export remembers"""

    # the search transformers' generate() runs by default; a flag not given (None) comes from the input, else
    # seqtrain-generate's default; the ranges are seqtrain-generate's (seqtrain.generation.search)
    beam: int | None = setting(None, "num_beams (default: 5)", type=int, metavar="N", bounds=Bounds(1, 10000))
    lenpen: float | None = setting(
        None, "length_penalty (default: 1.0)", type=float, metavar="X", bounds=Bounds(-1000, 1000)
    )
    max_len_b: int | None = setting(
        None,
        "at most N tokens before </s>: max_length N + 2, capped at the model's positions (default: 200)",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1 << 20),
    )
    min_len: int | None = setting(None, "min_length N + 1 (default: 1)", type=int, metavar="N")
    no_repeat_ngram_size: int | None = setting(
        None, "no_repeat_ngram_size (default: 0)", type=int, metavar="N"
    )


HF_GENERATION_HELP = (
    "the search the export remembers: --to hf, the generate() defaults of its generation_config.json (each "
    "flag not given comes from the input: the settings a seqtrain checkpoint stores, a run's --eval-rouge-args, "
    "a Hugging Face folder's generation_config.json; else seqtrain-generate's default); --to seqtrain, the "
    "settings it stores (seqtrain-generate's defaults for it); --to fairseq, the generation values of its args"
)


def convert(cfg: ConvertConfig, generation: HfGenerationConfig | None = None) -> None:
    """Convert as seqtrain-convert's flags say (ConvertConfig's; HfGenerationConfig's for --to hf), read once
    from seqtrain.flags.tools.get_convert_parser's parse by the program's front end (seqtrain_cli.convert)."""
    setup_logging()
    source = resolve_model_path(cfg.input, "input")  # a hub name: its cached snapshot
    # seqtrain.fileio's rule: the output (a file, or --to hf's folder) is none of the files read, by any spelling
    inputs = [("INPUT", source), ("--dict", cfg.dict_path), ("--lora-base", cfg.lora_base)]
    check_outputs_apart(
        [("OUTPUT", cfg.output)], inputs + [(flag, f) for flag, p in inputs for f in folder_files(p)]
    )
    # An HF export needs no dictionary (only the vocabulary size), so a fairseq input converts without one.
    ck = read_checkpoint(
        source,
        fmt=cfg.from_format,
        dict_path=cfg.dict_path,
        unsafe=cfg.unsafe_load,
        require_dict=cfg.to != "hf",
        lora_base=cfg.lora_base,
    )
    if cfg.ema:
        ema = TrainState.from_dict(ck.state).ema
        if not isinstance(ema, dict) or not ema:
            raise SeqtrainError(f"{source}: no EMA of the weights in it (train with --store-ema to keep one)")
        ck.model = dict(ema)
        logger.info(f"{source}: exporting the EMA of the weights (--ema)")
    for note in ck.notes:
        logger.info(f"{source}: {note}")
    if ck.src_dict is None:
        rows = ck.model["encoder.embed_tokens.weight"].shape[0]
        ck.src_dict = ck.tgt_dict = placeholder_dictionary(rows)
    # checks the weights fit the architecture before anything is written
    model = build_from_contents(ck, resize_vocab=cfg.resize_vocab)
    if merge_lora(model):  # fairseq and Hugging Face know no adapters: export W + (alpha / R) B A
        ck.args.lora_rank = 0
        logger.info(f"{source}: LoRA adapters merged into their weights")
    if cfg.dtype:  # after the merge, so adapters fold in at full precision
        model.to(getattr(torch, cfg.dtype))
    gen_flags = generation or HfGenerationConfig()
    carried = carried_generation(gen_flags, ck) if cfg.to != "hf" else None
    lm = LoadedModel(model, ck.args, ck.src_dict, ck.tgt_dict, None, ck.format, ck.tokenizer, carried)
    if carried is not None:
        where = "its args (fairseq's hub interface reads them)" if cfg.to == "fairseq" else "it"
        logger.info(f"{cfg.output}: generation settings stored in {where}: {carried.describe()}")
    if cfg.to == "fairseq":  # carries the update count and data position over into optimizer_history
        export_fairseq(lm, cfg.output, source=ck.state)
    elif cfg.to == "hf":
        settings, sources = export_generation_settings(gen_flags, ck)
        if settings.get("max_len_a"):
            logger.warning(
                f"max_len_a {settings['max_len_a']} has no transformers equivalent: generation_config.json's "
                "max_length comes from max_len_b alone"
            )
        tok = export_hf(lm, cfg.output, settings, sources)
        logger.info(
            f"{cfg.output}: generation_config.json from "
            + "; ".join(f"{k} {settings[k]} ({sources[k]})" for k in GENERATION_DEFAULTS)
        )
        if not tok:
            logger.warning(
                f"{source}: no gpt2 or sentencepiece tokenizer with it: no tokenizer files written"
            )
        elif tok["missing"]:
            logger.warning(
                f"{source}: {tok['missing']} tokens of the {tok['kind']} tokenizer are not in the dictionary; "
                "text using them tokenizes differently in transformers (seqtrain: <unk>)"
            )
    else:
        EXPORTERS[cfg.to](lm, cfg.output)
    n = sum(p.numel() for p in model.parameters())
    m = stored_model_fields(ck.args)
    logger.info(
        f"wrote {cfg.output} ({cfg.to}, from {ck.format}; {stored_arch(ck.args, cfg.to)}, d_model "
        f"{m['encoder_embed_dim']}, {m['encoder_layers']}+{m['decoder_layers']} layers, {n:,} parameters, "
        f"vocabulary {len(ck.tgt_dict)})"
    )


def stored_arch(args: Any, to: str) -> str:
    """The architecture as the written file names it (issue 40: the log named the source's, e.g. bart_small for
    a fairseq export that stores bart_base): fairseq's registered arch, the Hugging Face model type, or seqtrain's
    preset. `args`: the checkpoint's stored args."""
    if to == "fairseq":
        return f"arch {fairseq_arch(args)}"
    m = stored_model_fields(args)
    if to == "hf":
        return f"model_type {'mbart' if m.get('encoder_normalize_before', False) else 'bart'}"
    return f"arch {m['arch']}"


def _run_generation_args(text: Any, where: str) -> dict[str, Any]:
    """The export's settings among a training run's --eval-rouge-args (JSON object or flags)."""
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if k in GENERATION_DEFAULTS}
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for k, v in GENERATION_DEFAULTS.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None)
    try:
        known, _ = p.parse_known_args(shlex.split(text))
    except (ValueError, SystemExit):
        raise SeqtrainError(f"{where}: eval_rouge_args {text!r} cannot be read") from None
    return {k: v for k, v in vars(known).items() if v is not None}


def _run_preset_settings(path: Any) -> tuple[dict[str, Any], str] | None:
    """The generation keys of the --config preset the run trained with (configs/debdesc_small.yaml's beam 4,
    max-len-b 30, ...: what seqtrain-generate --config FILE uses), when that file is still there. Read here with
    PyYAML's safe loader (JSON is YAML) rather than seqtrain.flags' reader: checkpoint/ sits below flags/; a file
    that no longer reads as a mapping gives the defaults, as a missing one does."""
    if not isinstance(path, str) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
        return None
    import yaml  # only for a run that had a --config

    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    found: dict[str, Any] = {}
    stack = [values]
    while stack:  # sections (nested mappings) are flattened, as --config reads them
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        for k, v in node.items():
            if isinstance(v, dict):
                stack.append(v)
                continue
            key = str(k).lstrip("-").replace("-", "_")
            if key in GENERATION_DEFAULTS:
                found[key] = v
    return (found, f"the run's --config {path}") if found else None


def carried_generation(generation: HfGenerationConfig, ck: Any) -> StoredGeneration | None:
    """The generation settings a seqtrain or fairseq export stores: the input's own (a seqtrain checkpoint's
    stored settings, a Hugging Face folder's generation_config.json), with the convert flags given over them;
    None when there are none (an older seqtrain checkpoint or a fairseq one converts as before)."""
    base = ck.generation or StoredGeneration()
    if ck.format == "hf":
        found, _, path = read_generation_config(ck.path)
        own = {k: v for k, v in found.items() if k in STORED}
        base = StoredGeneration(own, dict.fromkeys(own, path))
    given = {k: v for k, v in dataclasses.asdict(generation).items() if v is not None}
    settings = {**base.settings, **given}
    sources = {**base.sources, **{k: f"seqtrain-convert --{k.replace('_', '-')}" for k in given}}
    return make_stored(settings, sources, ck.path) if settings else None


def export_generation_settings(
    generation: HfGenerationConfig, ck: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """The generation settings a Hugging Face export records, and where each came from: the convert flag given
    (--beam, --lenpen, --max-len-b, --min-len, --no-repeat-ngram-size), else the input's own (the settings a
    seqtrain checkpoint stores: its training preset's, seqtrain-tune's; for older checkpoints and fairseq's, a
    run's --eval-rouge-args, without those the generation keys of the --config preset the run trained with; a
    Hugging Face folder's generation_config.json), else seqtrain-generate's defaults."""
    stored = ck.generation
    if stored is not None:  # checked when it was read
        origins = {d: f"stored in the checkpoint, from {stored.sources.get(d, '?')}" for d in stored.settings}
        return _settings_with_sources(generation, dict(stored.settings), origins, ck.path)
    own: dict[str, Any] = {}
    origin = ""
    run = stored_run(ck.args)
    if ck.format == "hf":
        found, _, path = read_generation_config(ck.path)
        own = {k: v for k, v in found.items() if k in GENERATION_DEFAULTS}
        origin = os.path.basename(path)
    elif run.eval_rouge or run.eval_rouge_args:
        own = _run_generation_args(run.eval_rouge_args, ck.path)
        origin = "the run's --eval-rouge-args"
    if not own and ck.format != "hf":
        own, origin = _run_preset_settings(run.config) or (own, origin)
    return _settings_with_sources(generation, own, dict.fromkeys(own, origin), ck.path)


def _settings_with_sources(
    generation: HfGenerationConfig, own: dict[str, Any], origins: dict[str, str], path: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every setting of GENERATION_DEFAULTS with where it came from: the convert flag given, else the input's own
    (`own`, each from `origins`), else seqtrain-generate's default."""
    flags = dataclasses.asdict(generation)  # --max-len-a is no flag of seqtrain-convert: never given
    settings, sources = {}, {}
    for k, default in GENERATION_DEFAULTS.items():
        given = flags.get(k)
        if given is not None:
            settings[k], sources[k] = given, "--" + k.replace("_", "-")
        elif k in own:
            try:
                check_value(k, own[k])
            except argparse.ArgumentTypeError as e:
                raise SeqtrainError(f"{path}: {origins[k]}: {k} {own[k]!r} ({e})") from None
            settings[k], sources[k] = type(default)(own[k]), origins[k]
        else:
            settings[k], sources[k] = default, "seqtrain-generate's defaults"
    return settings, sources
