"""The fp16 unscale folded into fused AdamW (Optimizer.divide_grads_in_step): the kernel divides the still-scaled
gradients by loss scale x sample size (/ clip coefficient) where today's path multiplies them by the reciprocal
first (a pass over all gradients) and clips them (another).

Tolerance, proved: with u = 2**-24 (fp32's unit roundoff), today's gradient is g*fl(1/a)*c with three roundings,
the folded one g/fl(a/c) with two: they differ by at most 5u relative. Adam's moments are linear in g and g*g
(relative difference <= 5u and 10u, plus their own roundings, the same on both paths), so the update
m/(sqrt(v)+eps) differs by at most ~10u relative and a parameter by at most 1 ulp of itself (its rounding
can flip) plus lr x 10u x |update| per step. After N steps: |dp| <= N x (ulp(p) + 10u x lr x max|update|), the
bound asserted (max|update| <= 3 here, Adam's m/sqrt(v) with bias correction stays near 1); the first moment
within N x 6u x max|g| (it sums gradients of either sign), the second within N x 11u relative. The loss scaler's
decisions (fairseq's rules) are the same on both paths; a skipped step leaves everything bitwise untouched."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch

from seqtrain.optim import DynamicLossScaler, GradientOverflow
from tests.utils import optimizer_of

U = 2.0**-24
LR = 1e-3


def make(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(64, 48, generator=g) * 0.05),
        torch.nn.Parameter(torch.randn(48, generator=g)),
        torch.nn.Parameter(torch.randn(7, 3, 5, generator=g) * 3),
    ]


def adam(params: list) -> object:
    args = argparse.Namespace(
        optimizer="adam", lr=[LR], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.01
    )
    opt = optimizer_of(args, params)
    assert opt.folds_grad_scale  # torch's fused AdamW (CPU kernel since torch 2.4)
    return opt


def raw_grads(update: int, shapes: list, scale: float, size: int) -> list[torch.Tensor]:
    """What backward leaves: sums over `size` tokens of per-token gradients, times the loss scale."""
    g = torch.Generator().manual_seed(100 + update)
    return [torch.randn(s, generator=g) * size * scale * (0.3 + update % 3) for s in shapes]


def one_update(opt, params, scaler, grads, size, clip, fold) -> float | None:
    for p, g in zip(params, grads):
        p.grad = g.clone()
    a = size * scaler.loss_scale
    if fold:
        opt.divide_grads_in_step(torch.full((), a, dtype=torch.float32))
    else:
        opt.multiply_grads(1.0 / a)
    norm = opt.clip_grad_norm(clip)
    try:
        scaler.check_overflow(float(norm))
    except GradientOverflow:
        opt.zero_grad()
        return None
    opt.step()
    scaler.update()
    return float(norm)


def snapshot(params, opt) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in params]
    for p in params:
        out += [v.clone() for v in opt.optimizer.state[p].values()] if p in opt.optimizer.state else []
    return out


@pytest.mark.parametrize("clip", [0.0, 25.0], ids=["no-clip", "clip"])
def test_folded_updates_equal_todays_within_the_proved_bound(clip):
    n, overflow_at = 12, 5
    results = {}
    for fold in (False, True):
        params = make()
        opt = adam(params)
        scaler = DynamicLossScaler(init_scale=2.0**7, scale_window=3)
        log, scales = [], []
        gmax = [torch.zeros_like(p) for p in params]  # elementwise max |gradient| the steps used
        for update in range(n):
            size = 37 + 11 * update
            grads = raw_grads(update, [p.shape for p in params], scaler.loss_scale, size)
            if update == overflow_at:
                grads[1][3] = float("inf")
                before = snapshot(params, opt)
            norm = one_update(opt, params, scaler, grads, size, clip, fold)
            if update == overflow_at:
                assert norm is None  # skipped: weights, moments and step counts bitwise as before
                assert all(torch.equal(x, y) for x, y in zip(before, snapshot(params, opt)))
            if norm is not None:  # both paths leave the divided (and clipped) gradient in .grad
                gmax = [torch.maximum(m, p.grad.abs()) for m, p in zip(gmax, params)]
            log.append(norm)
            scales.append(scaler.loss_scale)
        results[fold] = (params, opt, log, scales, scaler.state_dict(), gmax)
    (p0, o0, n0, s0, st0, gmax), (p1, o1, n1, s1, st1, _) = results[False], results[True]
    assert s0 == s1 and st0 == st1  # the same fairseq scaler decisions: doubled, halved, doubled again
    assert s0[overflow_at] == s0[overflow_at - 1] / 2 and max(s0) > 2.0**7
    if clip:
        assert sum(x is not None and x > clip for x in n0) >= 3  # the clip binds on several updates
    for a, b in zip(n0, n1):
        assert (a is None) == (b is None) and (a is None or abs(a - b) <= 4 * U * a)
    steps = n - 1
    for a, b, g in zip(p0, p1, gmax):
        ulp = torch.abs(torch.nextafter(a.detach(), torch.full_like(a, float("inf"))) - a.detach())
        bound = steps * (ulp + 10 * U * LR * 3)
        assert torch.all((a - b).abs() <= bound), float((a - b).abs().max())
        sa, sb = o0.optimizer.state[a], o1.optimizer.state[b]
        assert torch.equal(sa["step"], sb["step"]) and float(sa["step"]) == steps
        # m sums gradients of either sign: its error is relative to the gradients, not to m; v's terms are >= 0
        dm, dv = (sa["exp_avg"] - sb["exp_avg"]).abs(), (sa["exp_avg_sq"] - sb["exp_avg_sq"]).abs()
        assert torch.all(dm <= steps * 6 * U * g), float((dm / g.clamp(min=1e-30)).max() / U)
        assert torch.all(dv <= steps * 11 * U * sa["exp_avg_sq"]), float((dv / sa["exp_avg_sq"]).max() / U)


def test_fused_kernel_skips_where_found_inf():
    """The kernel's own guard (found_inf from the norm): called anyway, the step changes nothing."""
    params = make()
    opt = adam(params)
    for p, g in zip(params, raw_grads(0, [p.shape for p in params], 128.0, 10)):
        p.grad = g
    opt.divide_grads_in_step(torch.full((), 1280.0))
    opt.clip_grad_norm(0.0)
    opt.step()  # a first clean step creates the state
    before = snapshot(params, opt)
    grads = raw_grads(1, [p.shape for p in params], 128.0, 10)
    grads[0][0, 0] = float("nan")
    for p, g in zip(params, grads):
        p.grad = g
    opt.divide_grads_in_step(torch.full((), 1280.0))
    assert not torch.isfinite(opt.clip_grad_norm(1.0))
    opt.step()
    assert all(torch.equal(x, y) for x, y in zip(before, snapshot(params, opt)))


def test_other_optimizers_do_not_fold():
    params = make()
    for name in ("sgd", "nag", "adafactor"):
        args = argparse.Namespace(optimizer=name, lr=[0.1], momentum=None, weight_decay=0.0)
        opt = optimizer_of(args, copy.deepcopy(params))
        assert not opt.folds_grad_scale
