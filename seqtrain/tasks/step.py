"""`StepContext`: the contract between the Trainer and a task's step.

The Trainer owns device, precision and loss scaling; a task's `train_step(sample, model, criterion, step,
update_num, ignore_grad)` runs the forward pass inside `step.autocast()` and calls `step.backward(loss)`, so it
needs to know neither (seqtrain.train.trainer builds one per batch).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class StepContext:
    """What a task's train_step gets from the Trainer for each batch: `autocast()`, the mixed-precision context
    for the forward pass, and `backward(loss)`, the backward pass with the fp16 loss scale applied."""

    def __init__(self, amp_dtype: torch.dtype | None, device: torch.device, scaler: Any):
        self.amp_dtype, self.device, self.scaler = amp_dtype, device, scaler

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
