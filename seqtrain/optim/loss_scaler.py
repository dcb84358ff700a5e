"""fp16 dynamic loss scaling with fairseq's flags and rules.

The loss is multiplied by `loss_scale` before backward so small fp16 gradients don't underflow. The trainer
divides the gradients by the scale again, computes the gradient norm and calls `check_overflow(grad_norm)`:
an inf/NaN norm halves the scale and raises `GradientOverflow` (an OverflowError): the trainer zeroes the
gradients and skips the step, and the update is not counted. After each clean step the trainer calls
`update()`; every `scale_window` clean steps in a row double the scale. Reaching `min_loss_scale` raises
`MinimumLossScaleError`, a SeqtrainError (printed as one line by the CLIs) and a FloatingPointError (what
fairseq raises, for code that catches that).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch

from seqtrain.config import add_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_FLOAT, POSITIVE_INT, PROBABILITY, Bounds


class GradientOverflow(OverflowError):
    """Gradients held inf/NaN: skip this step (the scale has already been lowered)."""


class MinimumLossScaleError(SeqtrainError, FloatingPointError):
    """The loss scale fell to --min-loss-scale: training cannot continue in fp16 as configured."""


@settings
class LossScalerConfig:
    """fp16 loss scaling (DynamicLossScaler, with --fp16)"""

    fp16_init_scale: int = setting(2**7, "initial fp16 loss scale", type=int, bounds=Bounds(1, 2**24))
    fp16_scale_window: int | None = setting(
        None,
        "clean updates before the loss scale doubles (default: 2**14 / world size / update freq)",
        type=int,
        bounds=POSITIVE_INT,
    )
    fp16_scale_tolerance: float = setting(
        0.0,
        "fraction of updates that may overflow before the scale is lowered",
        type=float,
        bounds=PROBABILITY,
    )
    min_loss_scale: float = setting(
        1e-4,
        "stop training when the loss scale falls to this value",
        type=float,
        metavar="D",
        bounds=POSITIVE_FLOAT,
    )
    threshold_loss_scale: float | None = setting(
        None, "never lower the scale below this", type=float, bounds=POSITIVE_FLOAT
    )


def add_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    return add_settings(parser, LossScalerConfig, "fp16 loss scaling")


def default_scale_window(world_size: int = 1, update_freq: int = 1) -> int:
    """fairseq's default: overflows are judged per optimizer update, which sees world_size * update_freq
    batches, so the window shrinks with both."""
    return int(2**14 / max(1, world_size) / max(1, update_freq))


class DynamicLossScaler:
    def __init__(
        self,
        init_scale: float = 2.0**7,
        scale_factor: float = 2.0,
        scale_window: int = 2000,
        tolerance: float = 0.0,
        threshold: float | None = None,
        min_loss_scale: float = 1e-4,
    ):
        self.loss_scale = float(init_scale)
        self.scale_factor = scale_factor
        self.scale_window = int(scale_window)
        self.tolerance = tolerance
        self.threshold = threshold
        self.min_loss_scale = min_loss_scale
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0

    @classmethod
    def from_config(
        cls, cfg: LossScalerConfig, world_size: int = 1, update_freq: int = 1
    ) -> DynamicLossScaler:
        window = cfg.fp16_scale_window
        return cls(
            init_scale=cfg.fp16_init_scale,
            scale_window=window if window is not None else default_scale_window(world_size, update_freq),
            tolerance=cfg.fp16_scale_tolerance,
            threshold=cfg.threshold_loss_scale,
            min_loss_scale=cfg.min_loss_scale,
        )

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.loss_scale

    def update(self) -> None:
        """Record a clean step; double the scale after scale_window clean steps since the last overflow."""
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
            self._last_rescale_iter = self._iter
        self._iter += 1

    @staticmethod
    def has_overflow(grad_norm: Any) -> bool:
        value = float(grad_norm)  # one device sync per update; the norm is needed for logging anyway
        return math.isinf(value) or math.isnan(value)

    def check_overflow(self, grad_norm: Any = None, overflow: bool = False) -> None:
        """Raise GradientOverflow (after lowering the scale) if grad_norm is inf/NaN or overflow is True."""
        if not (overflow or (grad_norm is not None and self.has_overflow(grad_norm))):
            return
        prev_scale = self.loss_scale
        since_rescale = self._iter - self._last_rescale_iter
        if since_rescale == 0:
            since_rescale = 1000  # fairseq's guard against dividing by zero right after a rescale
        self._last_overflow_iter = self._iter
        self._overflows_since_rescale += 1
        if self._overflows_since_rescale / since_rescale >= self.tolerance:
            self.loss_scale /= self.scale_factor
            if self.threshold is not None:
                self.loss_scale = max(self.loss_scale, self.threshold)
            self._last_rescale_iter = self._iter
            self._overflows_since_rescale = 0
        if self.loss_scale <= self.min_loss_scale:
            self.loss_scale = prev_scale
            raise MinimumLossScaleError(
                f"minimum loss scale reached (--min-loss-scale {self.min_loss_scale}): the loss is probably "
                "exploding; try a lower --lr, gradient clipping (--clip-norm), --bf16 instead of --fp16, a larger "
                "batch, checking the data for broken examples, or a different --fp16-init-scale"
            )
        self._iter += 1
        raise GradientOverflow(f"gradient overflow, setting loss scale to {self.loss_scale:g}")

    def state_dict(self) -> dict:
        return {
            "loss_scale": self.loss_scale,
            "iter": self._iter,
            "last_overflow_iter": self._last_overflow_iter,
            "last_rescale_iter": self._last_rescale_iter,
            "overflows_since_rescale": self._overflows_since_rescale,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the scale and counters; scale_window and the other settings come from the flags."""
        self.loss_scale = float(state["loss_scale"])
        self._iter = int(state.get("iter", 0))
        self._last_overflow_iter = int(state.get("last_overflow_iter", -1))
        self._last_rescale_iter = int(state.get("last_rescale_iter", -1))
        self._overflows_since_rescale = int(state.get("overflows_since_rescale", 0))
