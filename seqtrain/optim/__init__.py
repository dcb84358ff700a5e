"""Optimizers (adam, nag, sgd, adafactor), lr schedulers (fixed, inverse_sqrt, polynomial_decay,
reduce_lr_on_plateau, cosine) and the fp16 dynamic loss scaler, with fairseq's flags and behaviour; and the
Optimization flags of an update (accumulation, clipping, normalisation) and of when training stops."""

from seqtrain.config import int_list, setting, settings
from seqtrain.flag_bounds import POSITIVE_INT, Bounds
from seqtrain.optim.loss_scaler import DynamicLossScaler, GradientOverflow, MinimumLossScaleError
from seqtrain.optim.lr_scheduler import LRScheduler, build_lr_scheduler
from seqtrain.optim.optimizers import Optimizer, build_optimizer, parse_lr_list
from seqtrain.optim.overrides import check_optimizer_overrides


@settings
class OptimizationConfig:
    """Optimization: what one update is (accumulation, clipping; --sentence-avg is the criterion's) and when
    training stops (the Trainer's update and the training loop read them)"""

    max_epoch: int = setting(0, "stop after this epoch (0: no limit)", type=int, metavar="N")
    max_update: int = setting(0, "stop after this many updates (0: no limit)", type=int, metavar="N")
    stop_time_hours: float = setting(
        0, "stop after this much cumulative training time (0: no limit)", type=float, metavar="H"
    )
    clip_norm: float = setting(0.0, "clip gradients to this L2 norm (0: off)", type=float, metavar="NORM")
    update_freq: list[int] = setting(
        [1],
        "accumulate gradients over N batches per update (a list gives one value per epoch)",
        type=int_list,
        metavar="N1,N2,...",
        bounds=POSITIVE_INT,
    )
    merge_max_tokens: int = setting(
        0,
        "run consecutive --update-freq batches of an update as one forward/backward pass while the merged "
        "batch, padded, holds at most N token slots (rows x longer side, as --max-tokens counts): the same "
        "update up to summation order and dropout masks; decided from the batches' shapes only, so resume "
        "stays exact. 0 (default): one pass per batch",
        type=int,
        metavar="N",
    )
    stop_min_lr: float = setting(
        -1.0, "stop when the lr falls to this", type=float, metavar="LR", bounds=Bounds(0, 1000, off=-1)
    )


__all__ = [
    "DynamicLossScaler",
    "GradientOverflow",
    "MinimumLossScaleError",
    "LRScheduler",
    "OptimizationConfig",
    "build_lr_scheduler",
    "Optimizer",
    "build_optimizer",
    "check_optimizer_overrides",
    "parse_lr_list",
]
