"""EMA of the weights (fairseq's --store-ema): a shadow copy of the model that follows it after every update,
ema = decay * ema + (1 - decay) * weights.

fairseq 0.12's rules: the shadow starts as the model (or --ema-seed-model's EMA), is a plain copy of the weights
(decay 0) until --ema-start-update updates, then decays by --ema-decay; with --ema-update-freq N it moves every N
updates; `version` entries are never decayed. It is kept on the model's device in the model's dtype, or in fp32
(--ema-fp32, for low-precision models). Unlike fairseq, the update runs as foreach operations on the device with
a Python-float decay (no host-device sync), and the update-frequency counter is saved with the shadow, so a
resumed run moves the EMA at the same updates as the unbroken one (bitwise resume holds with EMA on).

Checkpoints keep it where fairseq does: extra_state["ema"] (the shadow in the model's dtype) and
extra_state["ema_fp32_params"] with --ema-fp32; seqtrain adds extra_state["ema_counter"] (those entries are
seqtrain.checkpoint.train_state's TrainState fields ema, ema_fp32_params, ema_counter). Under FSDP the shadow
holds the local shards of the model's DTensors; saving gathers full tensors (a collective every rank joins, as
the model's own state) and loading shards them again.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_INT, PROBABILITY


def _dtensor() -> Any:
    """torch.distributed.tensor when something has imported it (FSDP2 does, before it makes a DTensor), else
    None: a model without DTensors never needs it, and importing it costs every program ~1 s at start-up."""
    return sys.modules.get("torch.distributed.tensor")


def _is_dtensor(t: Any) -> bool:
    mod = _dtensor()
    return mod is not None and isinstance(t, mod.DTensor)


@settings
class EmaConfig:
    """EMA of the weights"""

    store_ema: bool = setting(False, "keep an exponential moving average of the weights", action="store_true")
    ema_decay: float = setting(0.9999, "EMA decay", type=float, metavar="D", bounds=PROBABILITY)
    ema_start_update: int = setting(
        0, "the EMA copies the weights (decay 0) until this many updates", type=int, metavar="N"
    )
    ema_seed_model: str | None = setting(
        None, "start the EMA from this checkpoint's EMA (or its weights) instead of the model", metavar="FILE"
    )
    ema_update_freq: int = setting(
        1, "move the EMA every N updates", type=int, metavar="N", bounds=POSITIVE_INT
    )
    ema_fp32: bool = setting(False, "keep the EMA in fp32 whatever the model's dtype", action="store_true")
    validate_with_ema: bool = setting(
        False,
        "validate (loss, --eval-rouge, checkpoint_best) with the EMA weights (seqtrain; needs --store-ema)",
        action="store_true",
    )


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


class EMA:
    def __init__(
        self,
        model: torch.nn.Module,
        decay: float = 0.9999,
        start_update: int = 0,
        update_freq: int = 1,
        fp32: bool = False,
    ):
        if not 0.0 <= decay <= 1.0:
            raise SeqtrainError(f"--ema-decay must be within [0, 1], got {decay}")
        self.decay, self.start_update, self.update_freq, self.fp32 = decay, start_update, update_freq, fp32
        self.counter = 0
        # tied weights (BART's three embeddings) share one shadow tensor, as they share one parameter
        self.shadow: dict[str, torch.Tensor] = {}
        first: dict[tuple, str] = {}
        self.decayed: list[str] = []
        for k, v in model.state_dict().items():
            local = v._local_tensor if _is_dtensor(v) else v
            ident = (local.data_ptr(), local.dtype, tuple(local.shape)) if local.numel() else None
            if ident is not None and ident in first:
                self.shadow[k] = self.shadow[first[ident]]
                continue
            if ident is not None:
                first[ident] = k
            self.shadow[k] = v.detach().clone()
            if v.is_floating_point() and "version" not in k:
                self.decayed.append(k)
        self.fp32_params: dict[str, torch.Tensor] = (
            {k: self.shadow[k].float() for k in self.decayed} if fp32 else {}
        )

    def current_decay(self, num_updates: int) -> float:
        return 0.0 if num_updates < self.start_update else self.decay

    @torch.no_grad()
    def step(self, model: torch.nn.Module, num_updates: int) -> None:
        """Move the shadow towards `model`'s weights after update number `num_updates`."""
        if self.update_freq > 1:
            self.counter += 1
            if self.counter < self.update_freq:
                return
            self.counter = 0
        decay = self.current_decay(num_updates)
        weights = model.state_dict()
        targets = [self.fp32_params[k] if self.fp32 else self.shadow[k] for k in self.decayed]
        sources = [weights[k].detach().to(t.dtype) for k, t in zip(self.decayed, targets)]
        if decay == 0.0:  # a copy (mul by 0 would turn an inf weight into nan)
            torch._foreach_copy_(targets, sources)
        else:
            torch._foreach_mul_(targets, decay)
            torch._foreach_add_(targets, sources, alpha=1.0 - decay)
        if self.fp32:
            torch._foreach_copy_([self.shadow[k] for k in self.decayed], targets)

    # --------------------------------------------------------------------------------------- checkpoint state
    def state(self) -> tuple[dict[str, torch.Tensor], int, dict[str, torch.Tensor] | None]:
        """(shadow, update-frequency counter, fp32 shadow or None): full tensors on the CPU, for a checkpoint."""
        shadow = {k: _full(v).detach().cpu() for k, v in self.shadow.items()}
        fp32 = {k: _full(v).detach().cpu() for k, v in self.fp32_params.items()} if self.fp32 else None
        return shadow, self.counter, fp32

    def _copy_in(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if _is_dtensor(dst):
            src = _dtensor().distribute_tensor(src.to(dst.dtype), dst.device_mesh, dst.placements)
        dst.copy_(src)

    @torch.no_grad()
    def load(self, ema: Any, counter: int | None, fp32_params: Any, where: str) -> None:
        """Restore what `state` returned, as a checkpoint stored it (`ema` None: the checkpoint has none)."""
        if not isinstance(ema, dict) or set(ema) != set(self.shadow):
            raise SeqtrainError(
                f"{where}: its EMA (extra_state['ema']) does not match this model's parameters"
                if isinstance(ema, dict)
                else f"{where}: no EMA in the checkpoint"
            )
        for k, v in ema.items():
            if tuple(v.shape) != tuple(_full(self.shadow[k]).shape):
                raise SeqtrainError(f"{where}: EMA entry {k} has shape {tuple(v.shape)}, the model another")
            self._copy_in(self.shadow[k], v)
        self.counter = int(counter or 0)
        if self.fp32:
            for k in self.decayed:
                saved = fp32_params[k] if isinstance(fp32_params, dict) and k in fp32_params else ema[k]
                self._copy_in(self.fp32_params[k], saved)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied_to(self, model: torch.nn.Module) -> Iterator[None]:
        """The model computes with the EMA weights inside the block (validation with --validate-with-ema); its own
        weights are back, bit for bit, after it."""
        weights = model.state_dict()
        saved = {k: weights[k].detach().clone() for k in self.decayed}
        torch._foreach_copy_([weights[k] for k in self.decayed], [self.shadow[k] for k in self.decayed])
        try:
            yield
        finally:
            torch._foreach_copy_([weights[k] for k in self.decayed], [saved[k] for k in self.decayed])
