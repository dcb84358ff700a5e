"""`--bf16 --bf16-mode fairseq`: fairseq's own bf16 training, where the model itself computes in bf16.

seqtrain's default `--bf16` (`--bf16-mode autocast`) keeps one fp32 model and lets autocast cast each matrix
product's operands. fairseq's `--bf16` casts the model (weights, activations, gradients: bf16) and steps the
optimizer on fp32 master copies of the weights (fairseq.optim.fp16_optimizer.FP16Optimizer without a loss
scaler). `Bf16Compute` is that arrangement, turned around so the rest of the Trainer keeps working on fp32:

- the Trainer's `model` stays the fp32 model: it *is* the master copy. The optimizer, clipping, the gradient
  norm, the EMA, freezing and every checkpoint see fp32 weights, so checkpoints hold the master weights as
  `model` (generation, export and averaging read full precision) and a resumed run is bitwise the unbroken one
  (fairseq saves the bf16 model and rebuilds the master from it on resume: lossy);
- `compute` is a bf16 copy of it that runs every forward and backward pass (DDP wraps it);
- after the backward passes, `grads_to_master()` moves each bf16 gradient into the fp32 parameter's `.grad`
  (an exact upcast; gradients fairseq-style accumulate in bf16 over the --update-freq batches), so the
  normalisation by the sample size, clipping and the update run in fp32;
- after the optimizer step, `refresh()` rounds the master weights to bf16 into the copy (round to nearest even).

A parameter without a gradient in an update (unused, or frozen) gets none on the master either, so the
optimizer skips it as it would in fp32. Memory per trained parameter: 4 (master) + 2 (copy) + 2 (bf16
gradient, freed at the move) + 4 (fp32 gradient) bytes, as fairseq's FP16Optimizer without flat gradients.
"""

from __future__ import annotations

import copy

import torch

from seqtrain.cuda import BF16_MODES, DeviceConfig
from seqtrain.errors import SeqtrainError


def bf16_mode(mode: str, device: DeviceConfig, ddp_backend: str) -> str:
    """The run's --bf16-mode, checked against the flags it cannot be combined with (one line each)."""
    mode = mode or "autocast"
    if mode not in BF16_MODES:
        raise SeqtrainError(f"--bf16-mode: choose from {', '.join(BF16_MODES)}, got {mode!r}")
    if mode == "autocast":
        return mode
    if not device.bf16:
        raise SeqtrainError("--bf16-mode fairseq needs --bf16 (it says how bf16 training runs)")
    if device.memory_efficient_bf16:
        raise SeqtrainError(
            "--memory-efficient-bf16 (bf16 weights without an fp32 master copy) cannot be combined with "
            "--bf16-mode fairseq (which keeps one); drop one of them"
        )
    if ddp_backend == "fully_sharded":
        raise SeqtrainError(
            "--bf16-mode fairseq cannot be used with --ddp-backend fully_sharded (as in fairseq); FSDP's own "
            "mixed precision computes in bf16 over fp32 shards: use --bf16 alone"
        )
    return mode


class Bf16Compute:
    """A bf16 copy of `model` (the fp32 master) for the forward and backward passes; see the module docstring."""

    def __init__(self, model: torch.nn.Module):
        self.master = model
        self.compute = copy.deepcopy(model).to(torch.bfloat16)
        # named_parameters lists a tied weight once, in the same order for the model and its copy
        master = dict(model.named_parameters())
        compute = dict(self.compute.named_parameters())
        self._all = [(master[k], compute[k]) for k in master if master[k].is_floating_point()]
        self._trained = [(p32, p16) for p32, p16 in self._all if p32.requires_grad]

    def tensors(self) -> list[torch.Tensor]:
        """The copy's parameters, buffers and gradients (Trainer.state_tensors)."""
        tensors = list(self.compute.parameters()) + list(self.compute.buffers())
        return tensors + [p.grad for p in self.compute.parameters() if p.grad is not None]

    def zero_grad(self) -> None:
        for _, p16 in self._trained:
            p16.grad = None

    @torch.no_grad()
    def grads_to_master(self) -> None:
        """Move the bf16 gradients into the fp32 parameters' `.grad` (upcast, exact); the copy keeps none."""
        for p32, p16 in self._trained:
            p32.grad = None if p16.grad is None else p16.grad.to(torch.float32)
            p16.grad = None

    @torch.no_grad()
    def refresh(self, trained_only: bool = True) -> None:
        """Round the master weights into the copy: after an optimizer step (the trained ones), or after the
        master was loaded or swapped (all, buffers included)."""
        pairs = self._trained if trained_only else self._all
        if pairs:
            torch._foreach_copy_([p16 for _, p16 in pairs], [p32 for p32, _ in pairs])
        if not trained_only:
            master = dict(self.master.named_buffers())
            for k, b16 in self.compute.named_buffers():
                b16.copy_(master[k])
