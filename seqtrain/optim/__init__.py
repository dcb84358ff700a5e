"""Optimizers (adam, nag, sgd, adafactor), lr schedulers (fixed, inverse_sqrt, polynomial_decay,
reduce_lr_on_plateau, cosine) and the fp16 dynamic loss scaler, with fairseq's flags and behaviour."""

from seqtrain.optim.loss_scaler import DynamicLossScaler, GradientOverflow, MinimumLossScaleError
from seqtrain.optim.lr_scheduler import LRScheduler, build_lr_scheduler
from seqtrain.optim.optimizers import Optimizer, build_optimizer, parse_lr_list
from seqtrain.optim.overrides import check_optimizer_overrides

__all__ = [
    "DynamicLossScaler",
    "GradientOverflow",
    "MinimumLossScaleError",
    "LRScheduler",
    "build_lr_scheduler",
    "Optimizer",
    "build_optimizer",
    "check_optimizer_overrides",
    "parse_lr_list",
]
