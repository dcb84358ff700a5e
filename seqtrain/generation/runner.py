"""The generation pipeline shared by seqtrain-generate, seqtrain-interactive and seqtrain.Summarizer.

load_for_generation (checkpoint of any format -> model, dictionaries, tokenizer, generation defaults) ->
encode (text -> source token ids) -> text_dataset -> plan_batches (length-sorted, under a token budget) ->
run_batches (SequenceGenerator, one batch at a time) -> decode. All three front ends go through these functions,
so a sentence gets the same summary from each (a hypothesis does not depend on its batch neighbours).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seqtrain import host_cpu
from seqtrain.checkpoint.fairseq import find_dictionaries, set_conventions, stored_conventions
from seqtrain.checkpoint.formats import read_checkpoint
from seqtrain.checkpoint.hf import generation_key, read_generation_config
from seqtrain.checkpoint.hf_files import read_decoder_start
from seqtrain.checkpoint.hub import resolve_model_path
from seqtrain.checkpoint.load import LORA_BASE_HELP, model_from_contents
from seqtrain.checkpoint.options import RESIZE_VOCAB_HELP, UNSAFE_LOAD_HELP
from seqtrain.config import setting, settings
from seqtrain.cuda import set_cuda_kernels
from seqtrain.data.batching import batch_by_size
from seqtrain.data.dictionary import Dictionary, add_language_symbols, language_id
from seqtrain.data.pair_dataset import LanguagePairDataset
from seqtrain.data.tokenizer import build_tokenizer, load_databin_tokenizer
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import loads_bounded
from seqtrain.generation.ensemble import EnsembleModel
from seqtrain.generation.scorer import SequenceScorer
from seqtrain.generation.search import GenerationConfig, check_generation_args, flag_name
from seqtrain.generation.sequence_generator import build_generator, generate_batch
from seqtrain.models.int8 import COMPUTE_TYPES, Int8Linear, int8_supported, quantize_int8
from seqtrain.tasks.translation import infer_language_pair

logger = logging.getLogger("seqtrain.generate")


@settings
class CheckpointLoadConfig:
    """Checkpoint"""

    path: str | None = setting(
        None,
        "checkpoint to generate with: a file, a Hugging Face folder, or a hub name org/name[@revision]",
        metavar="FILE",
    )
    results_path: str | None = setting(
        None, "write generate-{split}.txt here", metavar="DIR", not_in=("interactive", "tune")
    )
    unsafe_load: bool = setting(False, UNSAFE_LOAD_HELP, action="store_true")
    resize_vocab: bool = setting(False, RESIZE_VOCAB_HELP, action="store_true")
    lora_base: str | None = setting(None, LORA_BASE_HELP, metavar="PATH")


@dataclass
class GenerationModel:
    """A model ready to generate with: seqtrain.checkpoint.load.LoadedModel plus what generation needs around it."""

    lm: Any  # seqtrain.checkpoint.load.LoadedModel (lm.model in eval mode, on its device)
    tokenizer: Any  # seqtrain.data.tokenizer.Tokenizer (the "none" tokenizer when the model has none)
    src_lang: str
    tgt_lang: str
    force_bos: int | None  # token forced first in every hypothesis (<s> for --prepend-bos models)
    defaults: dict[str, Any] = field(default_factory=dict)  # generation flag defaults the model ships
    # the file they came from (a Hugging Face generation_config.json, a seqtrain checkpoint that stores them)
    defaults_from: str | None = None
    src_append: int | None = None  # token after every source's </s> (mBART's [src_lang])
    tgt_append: int | None = None  # token after every reference's </s> (mBART's [tgt_lang])
    start: int | None = None  # decoder start token (None: the generator's end token)
    end: int | None = None  # the token that ends a hypothesis (None: </s>)
    # where each default came from, by flag dest, when the source says more than `defaults_from` (a seqtrain
    # checkpoint: its --config preset, seqtrain-tune)
    default_sources: dict[str, str] = field(default_factory=dict)

    @property
    def strip(self) -> tuple[int, ...]:
        """Tokens dropped from hypothesis and reference text besides pad/bos/eos (fairseq strips the
        generator's eos; the start token is never output but may be forced)."""
        return tuple(t for t in (self.start, self.end) if t is not None)

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    @property
    def device(self) -> torch.device:
        return next(self.lm.model.parameters()).device


def load_for_generation(
    path: str,
    data: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    overrides: dict[str, Any] | None = None,
    unsafe: bool = False,
    dict_path: str | None = None,
    resize_vocab: bool = False,
    lora_base: str | None = None,
    task: str | None = None,
    langs: str | None = None,
) -> GenerationModel:
    """Load a seqtrain checkpoint, a fairseq model.pt (dictionary from `dict_path`, the data-bin or dict.txt next
    to it) or a Hugging Face folder (with its generation_config.json) on the CPU, in eval mode. `path` may be a
    hub name (`org/name[@revision]`, seqtrain.checkpoint.hub). `task` / `langs` (--task, --langs) turn on
    mBART's language tokens (language_tokens) when the checkpoint does not already say so."""
    host_cpu.keep_freed_memory()  # an inference process: freed buffers reused, not unmapped and faulted in again
    path = resolve_model_path(path, "--path")
    if not os.path.exists(path):
        raise SeqtrainError(f"--path {path}: no such file or folder")
    if data is not None and not os.path.isdir(data):
        raise SeqtrainError(f"DATA {data}: not a folder (expected a data-bin made by seqtrain-preprocess)")
    src_lang, tgt_lang = source_lang, target_lang
    if data is not None and (src_lang is None or tgt_lang is None):
        s, t = infer_language_pair(data)
        src_lang, tgt_lang = src_lang or s, tgt_lang or t
    given_langs = (src_lang, tgt_lang)
    src_lang, tgt_lang = src_lang or "source", tgt_lang or "target"
    if dict_path is None and data is not None and os.path.exists(os.path.join(data, f"dict.{src_lang}.txt")):
        dict_path = os.path.join(data, f"dict.{src_lang}.txt")
    # A seqtrain checkpoint carries the dictionaries it was trained with: keep them, so the check below can
    # catch a data-bin with other ones (load_model's dict_path would replace them and hide the mismatch).
    ck = read_checkpoint(path, unsafe=unsafe, require_dict=False, lora_base=lora_base)
    if langs:  # as fairseq-generate's --langs: the task adds the [lang] symbols to the dictionaries it loads
        set_conventions(ck.args, langs=langs)
    if task == PRETRAINED_BART_TASK:
        set_conventions(ck.args, task=task)
    if ck.format != "seqtrain" and (dict_path is not None or ck.format == "fairseq"):
        ck.src_dict, ck.tgt_dict, ck.tokenizer = find_dictionaries(path, ck.args, dict_path)
    if ck.src_dict is None:
        raise SeqtrainError(
            f"{path}: no dictionary found; give a data-bin (DATA) holding dict.{src_lang}.txt"
        )
    if ck.format == "hf":  # the generation settings the folder ships, checked before the model is built
        defaults, forced_bos, source = read_generation_config(path)
        check_model_defaults(defaults, forced_bos, source, len(ck.tgt_dict or ck.src_dict))
    lm = model_from_contents(ck, overrides or None, resize_vocab=resize_vocab)
    stored = stored_conventions(lm.args)
    if data is not None:  # the data-bin's dictionaries must be the ones the model was trained with
        for lang, have, side in ((src_lang, lm.src_dict, "source"), (tgt_lang, lm.tgt_dict, "target")):
            p = os.path.join(data, f"dict.{lang}.txt")
            # mBART's task adds its [lang] symbols and <mask> to the data-bin's dictionaries as it loads them
            want = add_language_symbols(Dictionary.load(p), stored.langs) if os.path.exists(p) else None
            if want is not None and want != have:
                raise SeqtrainError(
                    f"{p}: the {side} dictionary differs from the one in {path} "
                    f"({want.difference(have)}); generate with the data-bin the model was trained on"
                )
    tokenizer = lm.tokenizer
    if tokenizer is None and data is not None:
        tokenizer = load_databin_tokenizer(data)
    if tokenizer is None:
        tokenizer = build_tokenizer({"kind": "none"})
    force_bos = lm.tgt_dict.bos() if stored.prepend_bos else None
    tokens = language_tokens(lm, given_langs, read_decoder_start(path) if ck.format == "hf" else None)
    if ck.format != "hf":
        stored = ck.generation  # a seqtrain checkpoint's remembered settings (older ones and fairseq's: none)
        if stored is None:
            return GenerationModel(lm, tokenizer, src_lang, tgt_lang, force_bos, **tokens)
        where = f"{path}: stored generation settings"
        check_model_defaults(stored.settings, None, where, len(lm.tgt_dict), keys=str)
        return GenerationModel(
            lm,
            tokenizer,
            src_lang,
            tgt_lang,
            force_bos,
            dict(stored.settings),
            path,
            default_sources=dict(stored.sources),
            **tokens,
        )

    if forced_bos is not False:  # the folder says which token (if any) transformers forces first
        force_bos = forced_bos
    tokens.pop("end", None)  # transformers ends at eos_token_id (</s>), whatever the start token
    return GenerationModel(lm, tokenizer, src_lang, tgt_lang, force_bos, defaults, source, **tokens)


PRETRAINED_BART_TASK = "translation_from_pretrained_bart"


def language_tokens(lm: Any, given: tuple[str | None, str | None], hf_start: int | None) -> dict[str, int]:
    """GenerationModel's language-token fields. A model trained (or generating) with --task
    translation_from_pretrained_bart follows fairseq's task: `[src]` after every source, `[tgt]` after every
    reference, decoding starting from and ending at `[tgt]`; the languages are --source-lang / --target-lang
    (`given`), else the checkpoint's. Otherwise a Hugging Face folder's decoder_start_token_id (`hf_start`) is
    where decoding starts (transformers' mBART: the target language's code), and </s> ends it."""
    a = stored_conventions(lm.args)
    if a.task != PRETRAINED_BART_TASK:
        eos = lm.tgt_dict.eos()
        return {"start": hf_start} if hf_start is not None and hf_start != eos else {}
    src = language_id(lm.src_dict, given[0] or a.source_lang, "--source-lang", a.langs)
    tgt = language_id(lm.tgt_dict, given[1] or a.target_lang, "--target-lang", a.langs)
    return dict(src_append=src, tgt_append=tgt, start=tgt, end=tgt)


def check_model_defaults(
    defaults: dict[str, Any],
    forced_bos: Any,
    source: str,
    vocab: int,
    keys: Callable[[str], str] = generation_key,
) -> None:
    """A Hugging Face folder's (or a seqtrain checkpoint's stored) generation settings pass the command line's
    check (check_generation_args, on top of the defaults, naming the file and its keys), and its forced first
    token is a token of the model."""
    config = dataclasses.replace(GenerationConfig(), **defaults)
    check_generation_args(config, lambda dest: f"{source}: {keys(dest)}")
    if forced_bos not in (None, False) and forced_bos >= vocab:
        raise SeqtrainError(
            f"{source}: forced_bos_token_id={forced_bos} is not a token of the model (ids 0 to {vocab - 1})"
        )


def check_beam_width(config: GenerationConfig, vocab: int, name: Callable[[str], str] = flag_name) -> None:
    """A beam the search can fill: each step's candidates are tokens of the target vocabulary less <pad>, which
    no search picks, so beam search keeps at most `vocab` - 1 hypotheses (diverse beam search that many per
    group); sampling draws with replacement and has no such limit. fairseq's generator caps --beam there
    silently; a wider beam ended in a RuntimeError inside the search. `name` names the setting as the caller's
    source does (check_generation_args's convention); `config` has passed check_generation_args."""
    if config.sampling:
        return
    groups = max(config.diverse_beam_groups, 1)
    if config.beam // groups > vocab - 1:
        per = f" per group of {name('diverse_beam_groups')} {groups}" if groups > 1 else ""
        raise SeqtrainError(
            f"{name('beam')} {config.beam} is wider than the model's vocabulary allows: beam search keeps at most "
            f"{vocab - 1} hypotheses{per} (its {vocab} target symbols less <pad>, which no search picks); give "
            f"{name('beam')} {(vocab - 1) * groups} or less"
        )


def make_generator(
    loaded: GenerationModel, config: GenerationConfig, name: Callable[[str], str] = flag_name
) -> Any:
    """The front ends' one way to a SequenceGenerator (seqtrain-generate, -interactive, -tune, Summarizer): the
    checked settings held against the model (check_beam_width), then build_generator with its start and end
    tokens."""
    check_beam_width(config, len(loaded.lm.tgt_dict), name)
    if config.static_decoding and is_int8(loaded):
        raise SeqtrainError(
            f"{name('static_decoding')}: static decoding runs float weights; not with the model's int8 linear "
            "layers (compute_type int8)"
        )
    return build_generator(loaded.model, loaded.lm.tgt_dict, config, bos=loaded.start, eos=loaded.end)


def is_int8(loaded: GenerationModel) -> bool:
    """Whether the model runs int8 linear layers (set_compute_type's int8)."""
    return any(isinstance(m, Int8Linear) for m in loaded.model.modules())


def cast(
    loaded: GenerationModel,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    cudnn_attention: bool = False,
    name: str = "cast",
) -> None:
    """Move the model to `device` and, when given, `dtype` (float16 / bfloat16 / float32). On CUDA, attention
    keeps off cuDNN's kernel unless `cudnn_attention` (seqtrain.cuda.set_cuda_kernels: incremental decoding
    meets a new shape every step). A model with int8 linear layers stays an fp32 CPU model: another device or
    dtype is refused here, naming the call (`name`), not deep inside the first search."""
    if is_int8(loaded) and (torch.device(device).type != "cpu" or dtype not in (None, torch.float32)):
        target = f"{torch.device(device).type}" if torch.device(device).type != "cpu" else str(dtype)
        raise SeqtrainError(
            f"{name}: the model runs int8 linear layers (compute_type int8), which take fp32 inputs on the CPU, "
            f"not {target.replace('torch.', '')}; load it again without compute_type='int8' for that"
        )
    loaded.lm.model = loaded.lm.model.to(device=device, dtype=dtype).eval()
    if torch.device(device).type == "cuda":
        set_cuda_kernels(tf32=None, cudnn_attention=cudnn_attention)


def set_compute_type(loaded: GenerationModel, compute_type: str, name: str = "compute_type") -> str:
    """Apply a compute type (CTranslate2's names) to a loaded, cast model; returns the one applied. int8: the
    linear layers become dynamically quantized int8 linears (seqtrain.models.int8), on the CPU, from fp32
    weights; auto: int8 where that holds and the CPU has a quantized engine, else default; default / float32:
    nothing (the weights as loaded and cast)."""
    if compute_type not in COMPUTE_TYPES:
        raise SeqtrainError(f"{name} must be one of {', '.join(COMPUTE_TYPES)}, got {compute_type!r}")
    fp32_cpu = loaded.device.type == "cpu" and next(loaded.model.parameters()).dtype == torch.float32
    if compute_type == "auto":
        compute_type = "int8" if fp32_cpu and int8_supported() else "default"
    if compute_type != "int8":
        return compute_type
    if loaded.device.type != "cpu":
        raise SeqtrainError(
            f"{name} int8 runs on the CPU only (torch's dynamic int8 linears): add --cpu, or use --fp16 / --bf16 "
            f"on {loaded.device.type}"
        )
    if not fp32_cpu:
        raise SeqtrainError(f"{name} int8 quantizes fp32 weights: not with --fp16 / --bf16")
    if not int8_supported():
        raise SeqtrainError(
            f"{name} int8: this torch build has no quantized CPU engine (fbgemm, x86, onednn)"
        )
    quantize_int8(loaded.model)
    return "int8"


def split_paths(path: str) -> list[str]:
    """--path's checkpoints: one, or several separated by ':' (an ensemble, as fairseq's --path a.pt:b.pt); a
    path that exists as given is one checkpoint, even with a ':' in its name."""
    if os.path.exists(path) or ":" not in path:
        return [path]
    paths = path.split(":")
    if "" in paths:
        raise SeqtrainError(f"--path {path}: an empty checkpoint name; separate checkpoints with one ':'")
    return paths


def ensemble(members: list[GenerationModel], paths: list[str]) -> GenerationModel:
    """One model of several loaded checkpoints (seqtrain.generation.ensemble.EnsembleModel), which must share the
    first one's dictionaries and forced first token; its tokenizer and settings are the first one's."""
    first = members[0]
    if len(members) == 1:
        return first
    for path, m in zip(paths[1:], members[1:]):
        for side in ("src_dict", "tgt_dict"):
            have, want = getattr(m.lm, side), getattr(first.lm, side)
            if have != want:
                raise SeqtrainError(
                    f"--path {path}: its {side[:3]} dictionary differs from {paths[0]}'s ({have.difference(want)}); "
                    "an ensemble's checkpoints must share their dictionaries"
                )
        if m.force_bos != first.force_bos:
            raise SeqtrainError(
                f"--path {path}: starts its outputs with token {m.force_bos}, {paths[0]} with {first.force_bos}; "
                "an ensemble's checkpoints must share their sequence convention (--prepend-bos)"
            )
        if (m.src_append, m.start, m.end) != (first.src_append, first.start, first.end):
            raise SeqtrainError(
                f"--path {path}: its language tokens (mBART's --langs, --source-lang, --target-lang) differ from "
                f"{paths[0]}'s; an ensemble's checkpoints must share their sequence convention"
            )
    first.lm.model = EnsembleModel([m.model for m in members])
    return first


def encode(loaded: GenerationModel, lines: Sequence[str]) -> list[torch.Tensor]:
    """Source token ids (with </s>) of raw text lines, through the model's tokenizer and dictionary."""
    d = loaded.lm.src_dict
    pieces = loaded.tokenizer.encode_batch(list(lines))
    return [d.encode_line(p, add_if_not_exist=False, append_eos=True).long() for p in pieces]


def text_dataset(
    loaded: GenerationModel, sources: list[torch.Tensor], truncate: bool = True, targets: Any = None
):
    """A LanguagePairDataset over encoded sources (and optional target dataset), with the model's sequence
    convention (padding side, <s> first) and position limits; sources too long for the model are truncated."""
    stored = stored_conventions(loaded.lm.args)
    max_src, max_tgt = loaded.model.max_positions()
    sizes = np.asarray(
        sources.sizes if hasattr(sources, "sizes") else [len(s) for s in sources], dtype=np.int64
    )
    return LanguagePairDataset(
        sources,
        sizes,
        loaded.lm.src_dict,
        targets,
        None if targets is None else np.asarray(targets.sizes),
        loaded.lm.tgt_dict if targets is not None else None,
        left_pad_source=stored.left_pad_source,
        left_pad_target=False,
        prepend_bos=stored.prepend_bos,
        max_source_positions=max_src,
        max_target_positions=max_tgt,
        shuffle=True,  # only orders ties in ordered_indices (seeded), as fairseq-generate does
        truncate_source=truncate,
        append_source=loaded.src_append,
        append_target=loaded.tgt_append if targets is not None else None,
        eos=loaded.end,
    )


def order_examples(ds: Any, keep: np.ndarray | None = None, seed: int = 1) -> np.ndarray:
    """The examples of `keep` (all when None) in fairseq-generate's order: by target, then source length."""
    order = np.asarray(ds.ordered_indices(seed), dtype=np.int64)
    return order if keep is None else order[np.isin(order, keep)]


def plan_batches(
    ds: Any, order: np.ndarray, max_tokens: int | None, batch_size: int | None
) -> list[np.ndarray]:
    """`order` cut into consecutive batches of at most `batch_size` sentences and `max_tokens` padded source
    tokens; nothing is ever dropped."""
    src_sizes = np.asarray(ds.src_sizes, dtype=np.int64)
    return batch_by_size(
        order,
        num_tokens_vec=src_sizes[order],
        max_tokens=max_tokens,
        max_sentences=batch_size,
        required_batch_size_multiple=1,
    )


def run_batches(
    loaded: GenerationModel,
    generator: Any,
    ds: Any,
    batches: Sequence[np.ndarray],
    prefix_size: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any], int, list[dict[str, Any]]]]:
    """Generate (or, with a SequenceScorer, score the references) batch by batch; yields (example id, collated
    sample, row in it, hypotheses best first)."""
    device = loaded.device
    for batch in batches:
        sample = ds.collater([ds[int(i)] for i in batch])
        sample["net_input"] = _to_device(sample["net_input"], device)
        with torch.no_grad():
            if isinstance(generator, SequenceScorer):  # --score-reference
                results = generator.score_batch(sample)
            else:
                results = generate_batch(
                    generator, sample, prefix_size=prefix_size, force_bos=loaded.force_bos
                )
        for row, (sid, hypos) in enumerate(results):
            yield sid, sample, row, hypos
        if on_batch is not None:
            on_batch(len(batch))


def _to_device(x: Any, device: torch.device) -> Any:
    """Every tensor of a collated input (nested dicts: the padding layout) on `device`."""
    if torch.is_tensor(x):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


def decode(loaded: GenerationModel, tokens: torch.Tensor) -> str:
    """Detokenized text of hypothesis tokens."""
    return loaded.tokenizer.decode(
        loaded.lm.tgt_dict.string(tokens.cpu(), extra_symbols_to_ignore=loaded.strip)
    )


def parse_overrides(text: str) -> dict[str, Any]:
    try:
        out = loads_bounded(text)
    except ValueError as e:  # also JSONBoundsError: nesting past 100 levels, an integer of 100 digits
        raise SeqtrainError(f"--model-overrides: not valid JSON ({e})") from None
    if not isinstance(out, dict):
        raise SeqtrainError("--model-overrides: give a JSON object, e.g. '{\"dropout\": 0.0}'")
    return out


def check_utf8(text: str, where: str, line: int) -> None:
    """Refuse text that came from invalid UTF-8: Python reads undecodable bytes as lone surrogates where the
    locale asks it to (stdin under the C locale: 'surrogateescape'), and those would reach the tokenizer.
    `where`:`line` is where the text started (stdin, or a file)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        before = text[: e.start]
        lineno = line + before.count("\n")
        column = len(before[before.rfind("\n") + 1 :].encode("utf-8", "surrogateescape")) + 1  # from 1
        char = ord(text[e.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"surrogate U+{char:04X}"
        raise SeqtrainError(
            f"{where}:{lineno}: invalid UTF-8 ({what} at byte {column} of the line)"
        ) from None
