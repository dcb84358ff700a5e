"""What seqtrain-generate, -interactive and -tune share below their front ends: their settings, read once from
the parsed flags into a GenerateConfig (each group as its component declares it; InputConfig here, the input,
scoring and model settings of the three programs), and the model they generate with (load_generation_model:
seqtrain.generation.runner's loading, driven by those settings)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from seqtrain import host_cpu
from seqtrain.checkpoint.generation_settings import flag as flag_of
from seqtrain.config import setting, settings
from seqtrain.cuda import DeviceConfig
from seqtrain.data.indexed_dataset import DataCheckConfig
from seqtrain.data.options import GenDatasetConfig
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import folder_files
from seqtrain.generation import runner
from seqtrain.generation.output import OutputConfig
from seqtrain.generation.rerank import RerankConfig
from seqtrain.generation.search import GenerationConfig
from seqtrain.logging.progress import LoggingConfig
from seqtrain.tasks import bpe_flags

logger = logging.getLogger("seqtrain.generate")


@settings
class InputConfig:
    """seqtrain-generate's input, scoring and model settings"""

    input: str | None = setting(
        None,
        "summarize raw text, one document per line ('-' for stdin), instead of a data-bin split",
        metavar="FILE",
    )
    reference: str | None = setting(
        None,
        "reference summaries for --input (one per line), for --scoring rouge",
        metavar="FILE",
        not_in=("interactive",),
    )
    scoring: str = setting(
        "none",
        "score hypotheses against the references (ROUGE-1/2/L/Lsum F1, stemming on)",
        choices=["none", "rouge"],
        not_in=("interactive", "tune"),
    )
    post_process: str | None = setting(
        None,
        "undo subword splitting in S-/T-/H- lines (sentencepiece, subword_nmt, "
        "'@@ '); D- lines and the hypothesis file are always detokenized",
        flags=("--post-process", "--remove-bpe"),
        nargs="?",
        const="@@ ",
        metavar="SYMBOL",
    )
    quiet: bool = setting(
        False, "print only the summary lines, not S-/T-/H-/D-/P-", action="store_true", not_in=("tune",)
    )
    score_reference: bool = setting(
        False,
        "score the references instead of generating: H-/P- lines give the model's log-probabilities of "
        "the target (fairseq's SequenceScorer)",
        action="store_true",
        not_in=("interactive", "tune"),
    )
    # fairseq-generate's task flags: sources (and targets) are cut or filtered at the smaller of these and the
    # model's own maximum, as fairseq's resolve_max_positions does
    max_source_positions: int = setting(
        1024, "max source length; the model's own maximum applies when smaller", type=int, metavar="N"
    )
    max_target_positions: int = setting(
        1024, "max target length; the model's own maximum applies when smaller", type=int, metavar="N"
    )
    model_overrides: str = setting("{}", "model args to override, e.g. '{\"dropout\": 0.0}'", metavar="JSON")
    compute_type: str = setting(
        "default",
        "as CTranslate2's --compute-type: int8 quantizes the linear layers' weights (per channel) and, per "
        "step, their inputs (the CPU only; faster, close to fp32's summaries); auto is int8 on a CPU that "
        "supports it, else default; default and float32: the weights as loaded (with --fp16 / --bf16 as given)",
        choices=["default", "auto", "float32", "int8"],
    )


@dataclass
class GenerateConfig:
    """What seqtrain-generate (and -interactive, -tune) read of their flags: made once from the parsed flags
    at the program's front end (from_args), each group as its component declares it."""

    data: str | None = None
    task: str = "translation"
    langs: str | None = None  # mBART's --langs (a flag of --task translation_from_pretrained_bart only)
    given_flags: list[str] = field(default_factory=list)  # set on the command line or in --config
    device: DeviceConfig = field(default_factory=DeviceConfig)
    log: LoggingConfig = field(default_factory=LoggingConfig)
    dataset: GenDatasetConfig = field(default_factory=GenDatasetConfig)
    data_check: DataCheckConfig = field(default_factory=DataCheckConfig)
    load: runner.CheckpointLoadConfig = field(default_factory=runner.CheckpointLoadConfig)
    search: GenerationConfig = field(default_factory=GenerationConfig)
    inputs: InputConfig = field(default_factory=InputConfig)
    outputs: OutputConfig = field(default_factory=OutputConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    bpe: bpe_flags.BpeConfig = field(default_factory=bpe_flags.BpeConfig)


def run_inputs(cfg: GenerateConfig) -> list[tuple[str, str | None]]:
    """The files a generation run reads, as (flag, path) for seqtrain.fileio.check_outputs_apart: --input,
    --reference, every --path checkpoint (a model folder's files), --lora-base and the data-bin's files."""
    inputs = [("--input", cfg.inputs.input), ("--reference", cfg.inputs.reference)]
    for flag, value in (("--path", cfg.load.path), ("--lora-base", cfg.load.lora_base)):
        for path in runner.split_paths(value) if value else []:
            inputs += [(flag, f) for f in folder_files(path)]
    return inputs + [("DATA", f) for f in folder_files(cfg.data)]


def apply_model_defaults(loaded: runner.GenerationModel, search: GenerationConfig, given: set[str]) -> None:
    """Take the generation defaults the model ships (a Hugging Face generation_config.json, the settings a
    seqtrain checkpoint stores) into `search` for every flag not given on the command line or in --config; one
    log line says which were taken (a checkpoint's: each with where it came from, the training --config preset
    or seqtrain-tune) and which given flags were kept."""
    if loaded.defaults_from is None:
        return
    taken, kept = {}, []
    for dest, value in loaded.defaults.items():
        if dest in given:
            kept.append(dest)
            continue
        setattr(search, dest, value)
        taken[dest] = value
    if loaded.default_sources:  # a seqtrain checkpoint's remembered settings, each with its origin
        by_source: dict[str, list[str]] = {}
        for dest, value in taken.items():
            by_source.setdefault(loaded.default_sources.get(dest, "stored"), []).append(
                f"{flag_of(dest)} {value}"
            )
        what = "; ".join(f"{', '.join(flags)} (from {source})" for source, flags in by_source.items())
        line = f"generation settings stored in the checkpoint, taken: {what or 'none'}"
        kept_flags = [f"{flag_of(dest)} {getattr(search, dest)}" for dest in kept]
    else:
        what = ", ".join(flag_of(d) if v is True else f"{flag_of(d)} {v}" for d, v in taken.items())
        bos = "none" if loaded.force_bos is None else loaded.force_bos
        line = f"generation defaults taken: {what or 'none'}; forced first token: {bos}"
        kept_flags = [flag_of(dest) for dest in kept]
    logger.info(
        f"{loaded.defaults_from}: {line}"
        + (f"; given flags kept: {', '.join(kept_flags)}" if kept_flags else "")
    )


def load_generation_model(cfg: GenerateConfig) -> runner.GenerationModel:
    """The model seqtrain-generate, -interactive and -tune generate with, from their settings: loaded from
    --path (--model-overrides, --unsafe-load), on CUDA unless --cpu or none is present, in --fp16 / --bf16 when
    given, with the generation defaults a Hugging Face folder ships taken into cfg.search for every flag the user
    did not give."""
    device_cfg, inputs = cfg.device, cfg.inputs
    use_cuda = torch.cuda.is_available() and not device_cfg.cpu
    if device_cfg.fp16 and not use_cuda:
        raise SeqtrainError("--fp16 needs a CUDA device (use --bf16, or fp32, on the CPU)")
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    # threads for the machine as training picks them: torch's one per core, on a 2-core machine that other work
    # keeps busy, made seqtrain-generate 13x slower (the quickstart's 300 test summaries: 65 s against 4.9 s)
    threads = host_cpu.fit_threads(device.type, program="generation")
    if threads is not None:
        logger.info(threads)
    torch.manual_seed(device_cfg.seed)
    overrides = runner.parse_overrides(inputs.model_overrides)
    given = set(cfg.given_flags)  # parse_generation_args's; none for a parser's own parse
    positions = {
        "max_source_positions": inputs.max_source_positions,
        "max_target_positions": inputs.max_target_positions,
    }
    for dest, value in positions.items():
        if (
            dest in given and dest not in overrides
        ):  # longer inputs than the checkpoint's: positions are extended
            overrides[dest] = value
    if cfg.bpe.bpe and cfg.data and os.path.isdir(cfg.data):
        # fairseq-generate's --bpe flags: accepted where they name the data-bin's own tokenizer (checked)
        bpe_flags.databin_tokenizer(cfg.bpe, cfg.data)
    paths = runner.split_paths(cfg.load.path)
    members = [
        runner.load_for_generation(
            path,
            cfg.data,
            cfg.dataset.source_lang,
            cfg.dataset.target_lang,
            overrides,
            cfg.load.unsafe_load,
            resize_vocab=cfg.load.resize_vocab,
            lora_base=cfg.load.lora_base,
            task=cfg.task,
            langs=cfg.langs,
        )
        for path in paths
    ]
    loaded = runner.ensemble(members, paths)
    dtype = torch.float16 if device_cfg.fp16 else torch.bfloat16 if device_cfg.bf16 else None
    runner.cast(loaded, device, dtype, cudnn_attention=device_cfg.cudnn_attention)
    if cfg.search.static_decoding and inputs.compute_type in ("int8", "auto"):
        raise SeqtrainError(
            f"--static-decoding runs float weights; not with --compute-type {inputs.compute_type}"
        )
    runner.set_compute_type(loaded, inputs.compute_type, "--compute-type")
    apply_model_defaults(loaded, cfg.search, given)
    return loaded
