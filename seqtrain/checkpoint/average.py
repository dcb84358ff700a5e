"""seqtrain-average-checkpoints: the parameter mean of several checkpoints, as fairseq's
scripts/average_checkpoints.py computes it.

    seqtrain-average-checkpoints --inputs checkpoints/ --num-update-checkpoints 5 --output averaged.pt
    seqtrain-average-checkpoints --inputs a.pt b.pt c.pt --output averaged.pt

fairseq's semantics: `--inputs` names files, or with `--num-epoch-checkpoints N` / `--num-update-checkpoints N`
one folder whose N newest `checkpoint{E}.pt` / `checkpoint_{E}_{U}.pt` are averaged (`--checkpoint-upper-bound`
caps E or U). Every input must hold the same parameter names in the same order and the same shapes, and be the
same model: the same architecture arguments (`ARCH_ARGS`; equal shapes do not make one model: another activation
or layer norm placement gives tensors of the same shapes) and the same dictionaries (a row of one embedding
would be averaged with another word's row), as fairseq users assume; the first difference is named. Each
parameter is summed in input order and divided once by the count (fp16 tensors are averaged, and written, in
fp32; integer tensors are floor-divided), so on fp32 inputs the result is bit for bit fairseq's. The output
keeps the first input's format (seqtrain or fairseq) and its settings, dictionaries and tokenizer, without
optimizer state: it is a model to generate with or fine-tune from, not a run to resume.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import torch

from seqtrain.checkpoint.fairseq import raw_model_values
from seqtrain.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.train_state import TrainState
from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import check_outputs_apart
from seqtrain.logging import setup_logging

logger = logging.getLogger("seqtrain.average_checkpoints")

_EPOCH_FILE = re.compile(r"checkpoint(\d+)\.pt")
_UPDATE_FILE = re.compile(r"checkpoint_\d+_(\d+)\.pt")


@settings
class AverageConfig:
    """seqtrain-average-checkpoints (fairseq's scripts/average_checkpoints.py flags)"""

    inputs: list[str] = setting(
        None,
        "checkpoint files, or one folder with --num-epoch-checkpoints / --num-update-checkpoints",
        required=True,
        nargs="+",
        metavar="PATH",
    )
    output: str = setting(None, "write the averaged checkpoint here", required=True, metavar="FILE")
    # --num-epoch-checkpoints and --num-update-checkpoints exclude each other (EXCLUSIVE)
    num_epoch_checkpoints: int | None = setting(
        None, "average the N newest checkpoint{E}.pt in the --inputs folder", type=int, metavar="N"
    )
    num_update_checkpoints: int | None = setting(
        None, "average the N newest checkpoint_{E}_{U}.pt in the --inputs folder", type=int, metavar="N"
    )
    checkpoint_upper_bound: int | None = setting(
        None,
        "with --num-*-checkpoints: only epochs (or updates) up to N; e.g. --num-epoch-checkpoints 10 "
        "--checkpoint-upper-bound 50 averages checkpoints 41-50",
        type=int,
        metavar="N",
    )
    unsafe_load: bool = setting(
        False,
        "allow arbitrary unpickling of the inputs (may run code; only for trusted files)",
        action="store_true",
    )
    debug: bool = setting(False, "show tracebacks", action="store_true")


EXCLUSIVE = ("--num-epoch-checkpoints", "--num-update-checkpoints")


def last_n_checkpoints(folder: str, n: int, update_based: bool, upper_bound: int | None = None) -> list[str]:
    """The `n` newest epoch (`checkpoint{E}.pt`) or update (`checkpoint_{E}_{U}.pt`) checkpoints in `folder`,
    newest first, with E or U at most `upper_bound` when given."""
    if n < 1:
        raise SeqtrainError(
            f"--num-{'update' if update_based else 'epoch'}-checkpoints must be >= 1, got {n}"
        )
    if not os.path.isdir(folder):
        raise SeqtrainError(f"--inputs {folder}: not a folder (with --num-*-checkpoints, give the save dir)")
    pattern = _UPDATE_FILE if update_based else _EPOCH_FILE
    entries = []
    for name in os.listdir(folder):
        m = pattern.fullmatch(name)
        if m is not None and (upper_bound is None or int(m.group(1)) <= upper_bound):
            entries.append((int(m.group(1)), name))
    if len(entries) < n:
        kind = "checkpoint_E_U.pt" if update_based else "checkpointE.pt"
        bound = f" at or below {upper_bound}" if upper_bound is not None else ""
        raise SeqtrainError(f"{folder}: found {len(entries)} {kind} files{bound}, need {n}")
    return [os.path.join(folder, name) for _, name in sorted(entries, reverse=True)[:n]]


def _model_state(path: str, obj: Any) -> dict[str, torch.Tensor]:
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise SeqtrainError(f"{path}: not a seqtrain or fairseq checkpoint (no 'model' state dict)")
    return obj["model"]


# The args that make a model what it is (an average over inputs that differ in any of them is no model's weights)
ARCH_ARGS = (
    "arch",
    *(
        f"{side}_{name}"
        for side in ("encoder", "decoder")
        for name in ("embed_dim", "ffn_embed_dim", "layers")
    ),
    "encoder_attention_heads",
    "decoder_attention_heads",
    "max_source_positions",
    "max_target_positions",
    "activation_fn",
    "encoder_normalize_before",
    "decoder_normalize_before",
    "no_scale_embedding",
    "share_all_embeddings",
    "share_decoder_input_output_embed",
    "layernorm_embedding",
    "lora_rank",
    "lora_alpha",
    "lora_modules",
    "langs",
    "prepend_bos",
)


def check_same_model(path: str, obj: dict, first_path: str, first: dict) -> None:
    """`obj` (read from `path`) must be a checkpoint of the model `first` is: the same architecture arguments
    and the same dictionaries."""
    have, want = raw_model_values(obj), raw_model_values(first)
    for name in ARCH_ARGS:
        if have.get(name) != want.get(name):
            raise SeqtrainError(
                f"{path}: architecture argument {name}={have.get(name)!r}, {first_path} has "
                f"{name}={want.get(name)!r}; average one model's checkpoints"
            )
    for side in ("src_dict", "tgt_dict"):  # the symbols, in order (the counts are no part of the model)
        a, b = _symbols(obj.get(side)), _symbols(first.get(side))
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a or [], b or [])) if x != y), None)
            where = (
                f"symbol {at} is {a[at]!r}, not {b[at]!r}"
                if at is not None
                else f"{len(a or [])} vs {len(b or [])} symbols"
            )
            raise SeqtrainError(
                f"{path}: its {'source' if side == 'src_dict' else 'target'} dictionary differs from "
                f"{first_path}'s ({where}); average one model's checkpoints"
            )


def _symbols(entries: Any) -> list | None:
    if not isinstance(entries, list):
        return None
    return [e[0] if isinstance(e, (list, tuple)) and e else e for e in entries]


def average_checkpoints(paths: list[str], unsafe: bool = False) -> dict[str, Any]:
    """The first checkpoint's dict with its 'model' replaced by the mean over `paths` and its optimizer state
    dropped. Inputs are read one at a time (memory: the sum plus one checkpoint)."""
    if not paths:
        raise SeqtrainError("--inputs: give at least one checkpoint")
    sums: dict[str, torch.Tensor] = {}
    first: dict[str, Any] | None = None
    names: list[str] = []
    for path in paths:
        obj = load_checkpoint_file(path, unsafe=unsafe)
        state = _model_state(path, obj)
        if first is None:
            first, names = obj, list(state)
        else:
            check_same_model(path, obj, paths[0], first)
        if list(state) != names:
            missing = sorted(set(names) - set(state))[:3]
            extra = sorted(set(state) - set(names))[:3]
            what = (
                f"missing {missing}"
                if missing
                else f"extra {extra}"
                if extra
                else "the same names in another order"
            )
            raise SeqtrainError(
                f"{path}: parameters differ from {paths[0]}'s ({what}); average one model's checkpoints"
            )
        for name in names:
            p = state[name]
            if not isinstance(p, torch.Tensor):
                raise SeqtrainError(f"{path}: model entry {name!r} is not a tensor")
            if p.dtype == torch.float16:
                p = p.float()
            if name not in sums:
                sums[name] = p.clone()  # a copy: tied weights share storage, and the sum must not alias them
            elif p.shape != sums[name].shape:
                raise SeqtrainError(
                    f"{path}: {name} has shape {tuple(p.shape)}, {paths[0]} {tuple(sums[name].shape)}"
                )
            else:
                sums[name] += p
        del obj, state
    assert first is not None
    for t in sums.values():
        if t.is_floating_point():
            t.div_(len(paths))
        else:
            t.floor_divide_(len(paths))
    out = dict(first)
    out["model"] = sums
    if out.get("format") == "seqtrain":  # the rest of the training state stays the first input's
        out.update(TrainState.from_dict(first).without_optimizer().to_dict())
    else:  # fairseq
        out.pop("last_optimizer_state", None)
    return out


def main(cfg: AverageConfig) -> list[str]:
    """Average as seqtrain-average-checkpoints' flags say (AverageConfig's, read once from
    seqtrain.flags.tools.get_average_parser's parse by seqtrain_cli.average_checkpoints); returns the inputs
    used."""
    setup_logging()
    if (
        cfg.checkpoint_upper_bound is not None
        and cfg.num_epoch_checkpoints is None
        and (cfg.num_update_checkpoints is None)
    ):
        raise SeqtrainError(
            "--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints"
        )
    inputs = list(cfg.inputs)
    n = cfg.num_update_checkpoints if cfg.num_update_checkpoints is not None else cfg.num_epoch_checkpoints
    if n is not None:
        if len(inputs) != 1:
            raise SeqtrainError("--inputs: with --num-*-checkpoints, give one folder (the run's --save-dir)")
        inputs = last_n_checkpoints(
            inputs[0], n, cfg.num_update_checkpoints is not None, cfg.checkpoint_upper_bound
        )
    check_outputs_apart([("--output", cfg.output)], [("--inputs", p) for p in inputs])
    logger.info(f"averaging {len(inputs)} checkpoints: {', '.join(inputs)}")
    save_checkpoint_file(average_checkpoints(inputs, unsafe=cfg.unsafe_load), cfg.output)
    logger.info(f"wrote {cfg.output}")
    return inputs
