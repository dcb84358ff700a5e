"""Learning-rate schedulers with fairseq 0.12's names, flags and semantics.

Call sequence the trainer follows (as fairseq's trainer does):
  scheduler = build_lr_scheduler(cfg, optimizer); scheduler.step_update(0)     # right after building
  each epoch (1-based):  scheduler.step_begin_epoch(epoch)
  after each counted update:  scheduler.step_update(num_updates)                 # num_updates already incremented
  at epoch end, after validation:  scheduler.step(epoch, val_loss)
Each call sets the optimizer's lr and returns it. `state_dict()` holds every value the schedule depends on, so a
resumed run continues with identical learning rates.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import field
from typing import Any

from seqtrain.config import add_choice_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import FLOAT_MAX, POSITIVE_FLOAT, POSITIVE_INT, Bounds
from seqtrain.optim.optimizers import Optimizer, parse_lr_list
from seqtrain.registry import LR_SCHEDULERS


def _warmup_updates(default: int) -> Any:
    return setting(default, "warm the lr up linearly for the first N updates", type=int, metavar="N")


def _warmup_init_lr() -> Any:
    return setting(
        -1,
        "initial lr during warmup (default: 0 with warmup)",
        type=float,
        metavar="LR",
        bounds=Bounds(0, 1000, off=-1),
    )


def _lr_shrink() -> Any:
    return setting(
        0.1,
        "shrink factor for annealing, lr_new = lr * lr_shrink",
        type=float,
        metavar="LS",
        bounds=Bounds(0, 1, lo_open=True),
    )


def _force_anneal() -> Any:
    return setting(
        None,
        "force annealing at the given epoch (1-based)",
        flags=("--force-anneal", "--fa"),
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )


@settings
class SchedulerConfig:
    """LR scheduler: what every schedule reads besides its own flags (the optimizer's, training's)"""

    lr_scheduler: str = "fixed"  # the chosen --lr-scheduler (its settings: LR_SCHEDULERS.config(name))
    lr: list[float] = field(default_factory=lambda: [0.25])  # --lr (the optimizer's flag)
    max_update: int = 0  # OptimizationConfig's --max-update
    maximize_best_checkpoint_metric: bool = False  # CheckpointConfig's


@settings
class FixedConfig(SchedulerConfig):
    force_anneal: int | None = _force_anneal()
    lr_shrink: float = _lr_shrink()
    warmup_updates: int = _warmup_updates(0)


@settings
class InverseSqrtConfig(SchedulerConfig):
    warmup_updates: int = _warmup_updates(4000)
    warmup_init_lr: float = _warmup_init_lr()


@settings
class PolynomialDecayConfig(SchedulerConfig):
    warmup_updates: int = _warmup_updates(0)
    force_anneal: int | None = _force_anneal()
    end_learning_rate: float = setting(0.0, "learning rate to decay to", type=float, bounds=Bounds(0, 1000))
    power: float = setting(1.0, "decay exponent", type=float, bounds=POSITIVE_FLOAT)
    total_num_update: int | None = setting(
        None, "updates over which to decay the lr (default: --max-update)", type=int, bounds=POSITIVE_INT
    )


@settings
class ReduceLROnPlateauConfig(SchedulerConfig):
    lr_shrink: float = _lr_shrink()
    lr_threshold: float = setting(
        1e-4, "relative improvement needed to count as a new optimum", type=float, metavar="LT"
    )
    lr_patience: int = setting(
        0, "epochs with no improvement after which the lr is shrunk", type=int, metavar="N"
    )
    warmup_updates: int = _warmup_updates(0)
    warmup_init_lr: float = _warmup_init_lr()


@settings
class CosineConfig(SchedulerConfig):
    warmup_updates: int = _warmup_updates(0)
    warmup_init_lr: float = _warmup_init_lr()
    min_lr: float = setting(
        0.0, "cosine floor (fairseq 0.12: --lr is the peak)", type=float, bounds=Bounds(0, 1000)
    )
    max_lr: float | None = setting(
        None,
        "fairseq <= 0.10 form: the peak lr, with --lr as the floor",
        type=float,
        bounds=Bounds(0, 1000, lo_open=True),
    )
    lr_period_updates: float = setting(
        -1,
        "updates in the first period (default: --max-update - warmup)",
        type=float,
        bounds=Bounds(0, FLOAT_MAX, lo_open=True, off=-1),
    )
    t_mult: float = setting(
        1.0, "factor to grow the length of each period", type=float, bounds=POSITIVE_FLOAT
    )
    lr_shrink: float = _lr_shrink()


LR_SCHEDULERS.common = (
    SchedulerConfig  # what a --user-dir schedule registered without settings of its own reads
)


def add_args(parser: argparse.ArgumentParser, name: str | None = None) -> argparse._ArgumentGroup:
    """Add the flags of scheduler `name` (or of every registered one; see optimizers.add_args), then
    `--lr-scheduler`."""
    existing = parser._option_string_actions
    configs = [LR_SCHEDULERS.config(name)] if name is not None else LR_SCHEDULERS.configs()
    group = add_choice_settings(parser, configs, "LR scheduler" if name is None else f"LR scheduler ({name})")
    if "--lr-scheduler" not in existing:
        group.add_argument(
            "--lr-scheduler",
            default=name or "fixed",
            choices=list(LR_SCHEDULERS.names()),
            help="learning rate scheduler (fairseq names)",
        )
    return group


class LRScheduler:
    name = ""
    # attributes the schedule depends on besides `best`: saved and restored, so a resumed run continues exactly
    state_keys: tuple[str, ...] = ()

    def __init__(self, cfg: Any, optimizer: Optimizer):
        self.cfg = cfg  # this schedule's settings (LR_SCHEDULERS.config(name), read once by seqtrain-train's front end)
        self.optimizer = optimizer
        self.lrs = parse_lr_list(self.cfg.lr)
        self.best: float | None = None

    def opt(self, dest: str) -> Any:
        return getattr(self.cfg, dest)

    def _single_lr(self) -> float:
        if len(self.lrs) > 1:
            raise SeqtrainError(
                f"--lr: {self.name} takes one learning rate, got {self.lrs}; "
                "use --lr-scheduler fixed for one lr per epoch"
            )
        return self.lrs[0]

    def state_dict(self) -> dict:
        return {"best": self.best, **{k: getattr(self, k) for k in self.state_keys}}

    def load_state_dict(self, state: dict) -> None:
        self.best = state.get("best", self.best)
        for key in self.state_keys:
            if key in state:
                setattr(self, key, state[key])

    def step_begin_epoch(self, epoch: int) -> float:
        return self.optimizer.get_lr()

    def step(self, epoch: int, val_loss: float | None = None) -> float:
        if val_loss is not None:
            self.best = val_loss if self.best is None else min(self.best, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates: int) -> float:
        return self.optimizer.get_lr()


@LR_SCHEDULERS.register("fixed", config=FixedConfig)
class FixedSchedule(LRScheduler):
    """lr = lrs[epoch - 1] (last one repeated); from --force-anneal on, lrs[-1] * lr_shrink^(epoch + 1 - fa)."""

    name = "fixed"
    state_keys = ("lr", "warmup_factor")

    def __init__(self, cfg: Any, optimizer: Optimizer):
        super().__init__(cfg, optimizer)
        self.lr = self.lrs[0]
        self.warmup_updates = int(self.opt("warmup_updates") or 0)
        self.warmup_factor = 1.0 / self.warmup_updates if self.warmup_updates > 0 else 1.0

    def get_next_lr(self, epoch: int) -> float:
        fa = self.opt("force_anneal")
        if fa is None or epoch < fa:
            return self.lrs[min(epoch - 1, len(self.lrs) - 1)]
        return self.lrs[-1] * self.opt("lr_shrink") ** (epoch + 1 - fa)

    def step_begin_epoch(self, epoch: int) -> float:
        self.lr = self.get_next_lr(epoch)
        self.optimizer.set_lr(self.warmup_factor * self.lr)
        return self.optimizer.get_lr()

    def step_update(self, num_updates: int) -> float:
        if self.warmup_updates > 0 and num_updates < self.warmup_updates:
            self.warmup_factor = (num_updates + 1) / self.warmup_updates
            self.optimizer.set_lr(self.warmup_factor * self.lr)
        else:
            self.optimizer.set_lr(self.lr)
        return self.optimizer.get_lr()


@LR_SCHEDULERS.register("inverse_sqrt", config=InverseSqrtConfig)
class InverseSquareRootSchedule(LRScheduler):
    """Linear warmup from --warmup-init-lr to --lr over W updates, then lr * sqrt(W) / sqrt(num_updates)."""

    name = "inverse_sqrt"
    state_keys = ("lr",)

    def __init__(self, cfg: Any, optimizer: Optimizer):
        super().__init__(cfg, optimizer)
        peak = self._single_lr()
        self.warmup_updates = int(self.opt("warmup_updates"))
        if self.warmup_updates <= 0:
            raise SeqtrainError("--warmup-updates must be > 0 for --lr-scheduler inverse_sqrt")
        init = float(self.opt("warmup_init_lr"))
        self.warmup_init_lr = (0.0 if self.warmup_updates > 0 else peak) if init < 0 else init
        self.lr_step = (peak - self.warmup_init_lr) / self.warmup_updates
        self.decay_factor = peak * self.warmup_updates**0.5
        self.lr = self.warmup_init_lr
        self.optimizer.set_lr(self.lr)

    def step_update(self, num_updates: int) -> float:
        if num_updates < self.warmup_updates:
            self.lr = self.warmup_init_lr + num_updates * self.lr_step
        else:
            self.lr = self.decay_factor * num_updates**-0.5
        self.optimizer.set_lr(self.lr)
        return self.lr


@LR_SCHEDULERS.register("polynomial_decay", config=PolynomialDecayConfig)
class PolynomialDecaySchedule(LRScheduler):
    """Warmup lr * n/W for n <= W, then end + (lr - end) * (1 - (n - W)/(T - W))^power, end after T updates."""

    name = "polynomial_decay"
    state_keys = ("lr", "warmup_factor")

    def __init__(self, cfg: Any, optimizer: Optimizer):
        super().__init__(cfg, optimizer)
        self.lr = self.lrs[0]
        self.warmup_updates = int(self.opt("warmup_updates") or 0)
        self.warmup_factor = 1.0 / self.warmup_updates if self.warmup_updates > 0 else 1.0
        total = self.opt("total_num_update") or self.cfg.max_update or 0
        if total <= 0:
            raise SeqtrainError(
                "--total-num-update (or --max-update) must be > 0 for --lr-scheduler polynomial_decay"
            )
        self.total_num_update = int(total)
        self.end_learning_rate = float(self.opt("end_learning_rate"))
        self.power = float(self.opt("power"))
        self.optimizer.set_lr(self.warmup_factor * self.lr)

    def get_next_lr(self, epoch: int) -> float:
        fa = self.opt("force_anneal")
        if fa is None or epoch < fa:
            # fairseq 0.12 indexes with the 1-based epoch here (unlike `fixed`): lrs[1] in epoch 1
            return self.lrs[min(epoch, len(self.lrs) - 1)]
        return self.optimizer.get_lr()

    def step_begin_epoch(self, epoch: int) -> float:
        self.lr = self.get_next_lr(epoch)
        self.optimizer.set_lr(self.warmup_factor * self.lr)
        return self.optimizer.get_lr()

    def step_update(self, num_updates: int) -> float:
        w = self.warmup_updates
        if w > 0 and num_updates <= w:
            self.warmup_factor = num_updates / w
            lr = self.warmup_factor * self.lr
        elif num_updates >= self.total_num_update:
            lr = self.end_learning_rate
        else:
            remaining = 1 - (num_updates - w) / (self.total_num_update - w)
            lr = (self.lr - self.end_learning_rate) * remaining**self.power + self.end_learning_rate
        self.optimizer.set_lr(lr)
        return self.optimizer.get_lr()


@LR_SCHEDULERS.register("reduce_lr_on_plateau", config=ReduceLROnPlateauConfig)
class ReduceLROnPlateauSchedule(LRScheduler):
    """Optional linear warmup; afterwards, at each epoch end, lr *= lr_shrink once the validation metric has not
    improved by a relative --lr-threshold for more than --lr-patience epochs (torch's ReduceLROnPlateau rule,
    which fairseq wraps; kept here with its full state so resume is exact)."""

    name = "reduce_lr_on_plateau"
    state_keys = ("last_epoch", "num_bad_epochs", "lr", "warmup_end")

    def __init__(self, cfg: Any, optimizer: Optimizer):
        super().__init__(cfg, optimizer)
        peak = self._single_lr()
        self.maximize = self.cfg.maximize_best_checkpoint_metric
        self.shrink = float(self.opt("lr_shrink"))
        self.threshold = float(self.opt("lr_threshold"))
        self.patience = int(self.opt("lr_patience"))
        self.warmup_updates = int(self.opt("warmup_updates") or 0)
        init = float(self.opt("warmup_init_lr"))
        self.warmup_init_lr = (0.0 if self.warmup_updates > 0 else peak) if init < 0 else init
        self.lr_step = (peak - self.warmup_init_lr) / self.warmup_updates if self.warmup_updates > 0 else 0.0
        self.warmup_end = self.warmup_updates <= 0
        self.best = -math.inf if self.maximize else math.inf
        self.num_bad_epochs = 0
        self.last_epoch = 0
        self.lr = self.warmup_init_lr
        self.optimizer.set_lr(self.lr)

    def _improved(self, metric: float) -> bool:
        if self.maximize:
            return metric > self.best * (1 + self.threshold)
        return metric < self.best * (1 - self.threshold)

    def step(self, epoch: int, val_loss: float | None = None) -> float:
        self.last_epoch = epoch
        if val_loss is None or not self.warmup_end:
            return self.optimizer.get_lr()
        if self._improved(val_loss):
            self.best, self.num_bad_epochs = val_loss, 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.patience:
            old = self.optimizer.get_lr()
            new = old * self.shrink
            if old - new > 1e-8:  # torch's eps: changes below it are ignored
                self.optimizer.set_lr(new)
            self.num_bad_epochs = 0
        return self.optimizer.get_lr()

    def step_update(self, num_updates: int) -> float:
        if self.warmup_updates > 0:
            if num_updates <= self.warmup_updates:
                self.lr = self.warmup_init_lr + num_updates * self.lr_step
                self.optimizer.set_lr(self.lr)
            else:
                self.warmup_end = True
        return self.optimizer.get_lr()


@LR_SCHEDULERS.register("cosine", config=CosineConfig)
class CosineSchedule(LRScheduler):
    """SGDR (Loshchilov & Hutter): warmup to max_lr, then per period i of length period * t_mult^i,
    lr = min_i + (max_i - min_i) * (1 + cos(pi * t_curr / t_i)) / 2 with min_i, max_i shrunk by lr_shrink^i."""

    name = "cosine"
    state_keys = ("lr",)

    def __init__(self, cfg: Any, optimizer: Optimizer):
        super().__init__(cfg, optimizer)
        lr = self._single_lr()
        max_lr = self.opt("max_lr")
        if max_lr is not None:  # fairseq <= 0.10: --lr is the floor, --max-lr the peak
            self.min_lr, self.max_lr = lr, float(max_lr)
        else:
            self.min_lr, self.max_lr = float(self.opt("min_lr")), lr
        if self.max_lr <= self.min_lr:
            raise SeqtrainError(
                f"--lr-scheduler cosine: peak lr {self.max_lr} must exceed the floor {self.min_lr}"
            )
        init = float(self.opt("warmup_init_lr"))
        self.warmup_init_lr = self.min_lr if init < 0 else init
        self.warmup_updates = int(self.opt("warmup_updates") or 0)
        self.t_mult = float(self.opt("t_mult"))
        self.lr_shrink = float(self.opt("lr_shrink"))
        self.period = float(self.opt("lr_period_updates"))
        if self.period <= 0:
            max_update = self.cfg.max_update or 0
            if max_update <= 0:
                raise SeqtrainError("--lr-scheduler cosine needs --lr-period-updates or --max-update")
            self.period = max_update - self.warmup_updates
        self.lr_step = (
            (self.max_lr - self.warmup_init_lr) / self.warmup_updates if self.warmup_updates > 0 else 1.0
        )
        self.lr = self.warmup_init_lr
        self.optimizer.set_lr(self.lr)

    def step_update(self, num_updates: int) -> float:
        if num_updates < self.warmup_updates:
            self.lr = self.warmup_init_lr + num_updates * self.lr_step
        else:
            cur = num_updates - self.warmup_updates
            if self.t_mult != 1:
                i = math.floor(math.log(1 - cur / self.period * (1 - self.t_mult), self.t_mult))
                t_i = self.t_mult**i * self.period
                t_curr = cur - (1 - self.t_mult**i) / (1 - self.t_mult) * self.period
            else:
                i = math.floor(cur / self.period)
                t_i = self.period
                t_curr = cur - self.period * i
            shrink = self.lr_shrink**i
            lo, hi = self.min_lr * shrink, self.max_lr * shrink
            self.lr = lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * t_curr / t_i))
        self.optimizer.set_lr(self.lr)
        return self.lr


def build_lr_scheduler(cfg: SchedulerConfig, optimizer: Optimizer) -> LRScheduler:
    """Build scheduler `cfg.lr_scheduler` (its settings: LR_SCHEDULERS.config(name)) driving `optimizer`'s rate;
    a registered scheduler class, --user-dir ones included, gets `cfg` as fairseq's get their args."""
    name = cfg.lr_scheduler or "fixed"
    if name not in LR_SCHEDULERS:
        raise SeqtrainError(
            f"--lr-scheduler: unknown scheduler {name!r}; choose from: {', '.join(LR_SCHEDULERS.names())}"
        )
    return LR_SCHEDULERS.get(name)(cfg, optimizer)
