"""Optimizers with fairseq's names, flags and update rules: adam, nag, sgd, adafactor.

`build_optimizer(cfg, params)` returns an `Optimizer`: a thin wrapper over a torch optimizer with fairseq's
`get_lr / set_lr`, gradient helpers, and a state dict of plain tensors and Python values (so checkpoints load
with `torch.load(weights_only=True)`).

Each optimizer registers with its settings class (`@OPTIMIZERS.register("adam", config=AdamConfig)`, as fairseq
registers a dataclass with each). `add_args(parser, name)` adds the flags of the chosen optimizer with fairseq's
defaults (what fairseq does after it knows `--optimizer`); `add_args(parser)` adds the union of all optimizers'
flags, where a flag whose default differs between optimizers (`--momentum`: nag 0.99, sgd 0.0) gets default None
and each optimizer's settings keep their own default (seqtrain.config.add_choice_settings). Flags already on the
parser are skipped, so a program may add shared ones (`--lr`, `--weight-decay`) itself.

Why one module: the flag tables, the builders and the wrapper's gradient helpers (multiply_grads, clip_grad_norm
and the fp16 divisor folded into fused AdamW's step, divide_grads_in_step) must agree on which torch optimizer
each name builds and what its step can take; split, each half would have to re-check the other's choices.
"""

from __future__ import annotations

import argparse
import ast
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from seqtrain.config import add_choice_settings, setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import POSITIVE_FLOAT, PROBABILITY, Bounds
from seqtrain.optim.overrides import check_optimizer_overrides
from seqtrain.registry import OPTIMIZERS

# ---------------------------------------------------------------------------------------------------------------
# settings classes of the optimizers and lr schedulers, one per component


def parse_lr_list(value: Any) -> list[float]:
    """fairseq's `--lr` list form: "0.1", "0.1,0.05", "[0.1, 0.05]", a float or a list -> list of floats."""
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, (list, tuple)):
        try:
            return [float(v) for v in value]
        except (TypeError, ValueError):
            raise SeqtrainError(f"--lr: expected numbers, got {value!r}") from None
    text = str(value).strip().strip("[]()")
    try:
        lrs = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SeqtrainError(f"--lr: expected a number or comma-separated numbers, got {value!r}") from None
    if not lrs:
        raise SeqtrainError(f"--lr: expected a number or comma-separated numbers, got {value!r}")
    return lrs


def _lr_arg(value: str) -> list[float]:
    try:
        return parse_lr_list(value)
    except SeqtrainError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None


def _literal_floats(value: Any, flag: str, n: int) -> tuple[float, ...]:
    """Parse fairseq's tuple-as-string flags ('(0.9, 0.999)') without eval."""
    try:
        parsed = ast.literal_eval(value) if isinstance(value, str) else value
        out = tuple(float(v) for v in parsed)
    except (ValueError, TypeError, SyntaxError):
        raise SeqtrainError(
            f"{flag}: expected a tuple of {n} numbers like '(0.9, 0.999)', got {value!r}"
        ) from None
    if len(out) != n:
        raise SeqtrainError(f"{flag}: expected {n} numbers, got {value!r}")
    return out


def _weight_decay(text: str) -> Any:
    return setting(
        0.0, text, flags=("--weight-decay", "--wd"), type=float, metavar="WD", bounds=Bounds(0, 1000)
    )


def _momentum(default: float) -> Any:
    return setting(default, "momentum factor", type=float, metavar="M", bounds=PROBABILITY)


@settings
class LrConfig:
    """Optimizer: the learning rate every optimizer takes"""

    optimizer: str = "adam"  # the chosen --optimizer (its settings: OPTIMIZERS.config(name))
    # 0: weights stay as loaded (checks of loading and resuming)
    lr: list[float] = setting(
        [0.25],
        "learning rate; a comma-separated list gives one per epoch (fixed schedule)",
        type=_lr_arg,
        metavar="LR_1,LR_2,...,LR_N",
        bounds=Bounds(0, 1000),
    )


@settings
class AdamConfig(LrConfig):
    """Optimizer (adam)"""

    adam_betas: str = setting("(0.9, 0.999)", "betas for Adam", metavar="B")
    adam_eps: float = setting(
        1e-8, "epsilon for Adam", type=float, metavar="D", bounds=Bounds(0, 1, lo_open=True)
    )
    weight_decay: float = _weight_decay("decoupled weight decay")


@settings
class NagConfig(LrConfig):
    """Optimizer (nag)"""

    momentum: float = _momentum(0.99)
    weight_decay: float = _weight_decay("weight decay")


@settings
class SgdConfig(LrConfig):
    """Optimizer (sgd)"""

    momentum: float = _momentum(0.0)
    weight_decay: float = _weight_decay("weight decay")


@settings
class AdafactorConfig(LrConfig):
    """Optimizer (adafactor)"""

    adafactor_eps: str = setting("(1e-30, 1e-3)", "epsilons for Adafactor", metavar="E")
    clip_threshold: float = setting(
        1.0,
        "threshold for clipping the update's root mean square",
        type=float,
        metavar="C",
        bounds=POSITIVE_FLOAT,
    )
    decay_rate: float = setting(
        -0.8, "decay rate of the second moment estimator", type=float, metavar="D", bounds=Bounds(-1, 0)
    )
    beta1: float | None = setting(
        None,
        "beta for the first moment estimator (off when unset)",
        type=float,
        metavar="B",
        bounds=PROBABILITY,
    )
    weight_decay: float = _weight_decay("weight decay")
    scale_parameter: bool = setting(False, "scale the lr by the parameter's RMS", action="store_true")
    relative_step: bool = setting(
        False, "use lr = 1/sqrt(step) (capped at 1e-2) instead of --lr", action="store_true"
    )
    warmup_init: bool = setting(False, "relative step warm-up: lr = min(1e-6*step, ...)", action="store_true")


OPTIMIZERS.common = LrConfig  # what a --user-dir optimizer registered without settings of its own reads


def add_args(parser: argparse.ArgumentParser, name: str | None = None) -> argparse._ArgumentGroup:
    """Add the flags of optimizer `name` (or of every registered optimizer), then `--optimizer`."""
    existing = parser._option_string_actions
    configs = [OPTIMIZERS.config(name)] if name is not None else OPTIMIZERS.configs()
    group = add_choice_settings(parser, configs, "Optimizer" if name is None else f"Optimizer ({name})")
    if "--optimizer" not in existing:
        group.add_argument(
            "--optimizer",
            default=name or "adam",
            choices=list(OPTIMIZERS.names()),
            help="optimizer (fairseq names)",
        )
    return group


# ---------------------------------------------------------------------------------------------------------------
# the wrapper every optimizer is returned in


class Optimizer:
    """A torch optimizer plus fairseq's optimizer interface (get_lr/set_lr, multiply_grads, clip_grad_norm)."""

    def __init__(self, optimizer: torch.optim.Optimizer, name: str):
        self.optimizer = optimizer
        self.name = name
        # divide_grads_in_step's divisor (and the found-inf flag), held until step() hands them to the kernel
        self._divisor: torch.Tensor | None = None
        self._found_inf: torch.Tensor | None = None

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def params(self) -> Iterable[torch.Tensor]:
        for group in self.optimizer.param_groups:
            yield from group["params"]

    def get_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, closure: Callable | None = None) -> Any:
        if self._divisor is None:
            return self.optimizer.step(closure)
        # torch's fused Adam(W) kernel divides each gradient by grad_scale and skips the update where found_inf
        # is set (GradScaler's contract: torch.amp.grad_scaler, `_step_supports_amp_scaling`)
        self.optimizer.grad_scale, self.optimizer.found_inf = self._divisor, self._found_inf
        try:
            return self.optimizer.step(closure)
        finally:
            del self.optimizer.grad_scale, self.optimizer.found_inf
            self._divisor = self._found_inf = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._divisor = self._found_inf = None

    @property
    def folds_grad_scale(self) -> bool:
        """Whether step() can divide the gradients itself (divide_grads_in_step): torch's fused Adam/AdamW."""
        return bool(getattr(self.optimizer, "_step_supports_amp_scaling", False)) and all(
            g.get("fused") for g in self.optimizer.param_groups
        )

    def divide_grads_in_step(self, divisor: torch.Tensor) -> None:
        """Leave the gradients as they are and have the next step() divide them by `divisor` (a 0-d fp32 tensor:
        the loss scale times the sample size) inside the fused kernel, instead of a pass of multiply_grads:
        clip_grad_norm then reports the norm of the divided gradients and folds its clip coefficient into the
        divisor. Only where folds_grad_scale."""
        if not self.folds_grad_scale:
            raise SeqtrainError(f"internal: --optimizer {self.name} cannot divide gradients in its step")
        self._divisor = divisor.to(torch.float32).reshape(())

    def multiply_grads(self, c: float | torch.Tensor) -> None:
        """Multiply all gradients by `c` (e.g. 1/sample_size, or 1/loss_scale)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, c)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Total L2 norm of the gradients (fp32); clips in place when max_norm > 0 (fairseq's --clip-norm)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True).float()  # torch >= 2.6
        if self._divisor is not None:  # the gradients are still to be divided (divide_grads_in_step)
            divisor = self._divisor.to(norm.device)
            norm = norm / divisor
            self._found_inf = (~torch.isfinite(norm)).float().to(grads[0].device)
            if max_norm > 0:
                coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
                self._divisor = (divisor / coef).to(grads[0].device)
            return norm
        if max_norm > 0:
            coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        return norm

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict, optimizer_overrides: dict | None = None) -> None:
        """Load optimizer state; `optimizer_overrides` (e.g. {"lr": 1e-4}) replace saved hyper-parameters, as
        fairseq's --optimizer-overrides does when resuming with different settings (checked first, against
        this optimizer's own settings: check_optimizer_overrides)."""
        overrides = check_optimizer_overrides(optimizer_overrides or {}, self.optimizer.param_groups[0])
        self.optimizer.load_state_dict(state_dict)
        for group in self.optimizer.param_groups:
            group.update(overrides)


# ---------------------------------------------------------------------------------------------------------------
# update rules fairseq has and torch doesn't


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _Fp32StateOptimizer(torch.optim.Optimizer):
    """Keeps optimizer statistics of fp16/bf16 parameters in fp32 across load_state_dict (torch would cast
    them to the parameter's dtype, so a resumed run would differ from an uninterrupted one)."""

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(i, {}).items():
                if torch.is_tensor(value) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=value.dtype, copy=True)


class NAG(_Fp32StateOptimizer):
    """fairseq's Nesterov accelerated gradient. The momentum buffer holds -lr * velocity, so when the learning
    rate changes the buffer is rescaled by lr/lr_old (the `lr_correct` term) to keep the velocity consistent."""

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, lr_old=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            wd, mom, lr = group["weight_decay"], group["momentum"], group["lr"]
            lr_correct = lr / group.get("lr_old", lr)
            for p in group["params"]:
                if p.grad is None:
                    continue
                low_precision = p.dtype in (torch.float16, torch.bfloat16)
                data = p.float() if low_precision else p
                grad = _upcast(p.grad)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad)
                buf = state["momentum_buffer"]
                if wd != 0:
                    data.mul_(1 - lr * wd)
                data.add_(buf, alpha=mom * mom * lr_correct)
                data.add_(grad, alpha=-(1 + mom) * lr)
                buf.mul_(mom * lr_correct).add_(grad, alpha=-lr)
                if low_precision:
                    p.copy_(data)
            group["lr_old"] = lr
        return loss


class Adafactor(_Fp32StateOptimizer):
    """Adafactor (Shazeer & Stern, 2018) as fairseq implements it: factored second moments for >= 2-D
    parameters, update clipping by RMS, optional first moment (beta1), relative step and parameter scaling.

    One deliberate difference: fairseq writes the per-parameter step size back into group["lr"], so with
    --scale-parameter and an external lr the step size compounds across parameters within a step. Here the step
    size is computed per parameter without touching group["lr"] (Hugging Face made the same fix). With fairseq's
    default flags (no --scale-parameter, no --relative-step) the two are identical.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ):
        if warmup_init and not relative_step:
            raise SeqtrainError("--warmup-init requires --relative-step (adafactor)")
        if lr is None and not relative_step:
            raise SeqtrainError("adafactor needs --lr unless --relative-step is set")
        defaults = dict(
            lr=lr if lr is not None else 0.0,
            eps=tuple(eps),
            clip_threshold=clip_threshold,
            decay_rate=decay_rate,
            beta1=beta1,
            weight_decay=weight_decay,
            scale_parameter=scale_parameter,
            relative_step=relative_step,
            warmup_init=warmup_init,
        )
        super().__init__(params, defaults)

    @staticmethod
    def _rms(t: torch.Tensor) -> torch.Tensor:
        return t.norm(2) / (t.numel() ** 0.5)

    @staticmethod
    def step_size(group: dict, step: int, param_rms: float) -> float:
        lr = group["lr"]
        if group["relative_step"]:
            min_step = 1e-6 * step if group["warmup_init"] else 1e-2
            lr = min(min_step, 1.0 / math.sqrt(step))
        scale = max(group["eps"][1], param_rms) if group["scale_parameter"] else 1.0
        return scale * lr

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            eps1, _ = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise SeqtrainError("adafactor does not support sparse gradients")
                grad = _upcast(p.grad)
                low_precision = p.dtype in (torch.float16, torch.bfloat16)
                data = p.float() if low_precision else p
                state = self.state[p]
                factored = grad.dim() >= 2
                if not state:
                    state["step"] = 0
                    if group["beta1"] is not None:
                        state["exp_avg"] = torch.zeros_like(grad)
                    if factored:
                        state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
                        state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
                    else:
                        state["exp_avg_sq"] = torch.zeros_like(grad)
                state["step"] += 1
                state["RMS"] = self._rms(data)
                lr = self.step_size(group, state["step"], float(state["RMS"]))

                beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
                sq = grad * grad + eps1
                if factored:
                    row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                    row.mul_(beta2t).add_(sq.mean(dim=-1), alpha=1.0 - beta2t)
                    col.mul_(beta2t).add_(sq.mean(dim=-2), alpha=1.0 - beta2t)
                    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                    c = col.unsqueeze(-2).rsqrt()
                    update = (r * c).mul_(grad)
                else:
                    v = state["exp_avg_sq"]
                    v.mul_(beta2t).add_(sq, alpha=1.0 - beta2t)
                    update = v.rsqrt().mul_(grad)
                update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
                update.mul_(lr)
                if group["beta1"] is not None:
                    m = state["exp_avg"]
                    m.mul_(group["beta1"]).add_(update, alpha=1 - group["beta1"])
                    update = m
                if group["weight_decay"] != 0:
                    data.add_(data, alpha=-group["weight_decay"] * lr)
                data.add_(-update)
                if low_precision:
                    p.copy_(data)
        return loss


# ---------------------------------------------------------------------------------------------------------------
# builders


def _trainable(params: Iterable) -> list:
    params = list(params)
    if params and isinstance(params[0], dict):
        return params
    return [p for p in params if p.requires_grad]


@OPTIMIZERS.register("adam", config=AdamConfig)
def build_adam(c: AdamConfig, params: Iterable) -> Optimizer:
    """fairseq's adam (decoupled weight decay, i.e. AdamW). Differs from fairseq's own loop only in where eps
    enters the bias correction (torch: sqrt(v/bc2) + eps; fairseq: (sqrt(v) + eps)/sqrt(bc2)), which matters only
    while sqrt(v) is comparable to eps."""
    params = _trainable(params)
    kw = dict(
        lr=parse_lr_list(c.lr)[0],
        betas=_literal_floats(c.adam_betas, "--adam-betas", 2),
        eps=float(c.adam_eps),
        weight_decay=float(c.weight_decay),
    )
    # fused: one kernel for all parameters, on CUDA and (torch >= 2.4) on the CPU too, where it is also several
    # times faster than foreach and needs no parameter-sized temporaries (bart_base: 408 MiB less at the step)
    try:
        return Optimizer(torch.optim.AdamW(params, fused=True, **kw), "adam")
    except (RuntimeError, ValueError, TypeError):
        return Optimizer(torch.optim.AdamW(params, foreach=True, **kw), "adam")


@OPTIMIZERS.register("nag", config=NagConfig)
def build_nag(c: NagConfig, params: Iterable) -> Optimizer:
    return Optimizer(
        NAG(
            _trainable(params),
            lr=parse_lr_list(c.lr)[0],
            momentum=float(c.momentum),
            weight_decay=float(c.weight_decay),
        ),
        "nag",
    )


@OPTIMIZERS.register("sgd", config=SgdConfig)
def build_sgd(c: SgdConfig, params: Iterable) -> Optimizer:
    return Optimizer(
        torch.optim.SGD(
            _trainable(params),
            lr=parse_lr_list(c.lr)[0],
            momentum=float(c.momentum),
            weight_decay=float(c.weight_decay),
            foreach=True,
        ),
        "sgd",
    )


@OPTIMIZERS.register("adafactor", config=AdafactorConfig)
def build_adafactor(c: AdafactorConfig, params: Iterable) -> Optimizer:
    """fairseq's adafactor flags. With --relative-step the step size comes from the step count and --lr is
    ignored (fairseq refuses the combination, but its --lr always has a value, so it could never be used)."""
    opt = Adafactor(
        _trainable(params),
        lr=None if c.relative_step else parse_lr_list(c.lr)[0],
        eps=_literal_floats(c.adafactor_eps, "--adafactor-eps", 2),
        clip_threshold=float(c.clip_threshold),
        decay_rate=float(c.decay_rate),
        beta1=c.beta1,
        weight_decay=float(c.weight_decay),
        scale_parameter=c.scale_parameter,
        relative_step=c.relative_step,
        warmup_init=c.warmup_init,
    )
    return Optimizer(opt, "adafactor")


def build_optimizer(cfg: LrConfig, params: Iterable) -> Optimizer:
    """Build optimizer `cfg.optimizer` over `params` (tensors; those without requires_grad are dropped, or param
    groups). `cfg`: its settings (OPTIMIZERS.config(name)); a registered builder, --user-dir ones included, gets
    it as fairseq's builders get their args (attribute access works the same)."""
    name = cfg.optimizer or "adam"
    if name not in OPTIMIZERS:
        raise SeqtrainError(
            f"--optimizer: unknown optimizer {name!r}; choose from: {', '.join(OPTIMIZERS.names())}"
        )
    return OPTIMIZERS.get(name)(cfg, params)
