import argparse

import pytest
import torch

from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.optim import DynamicLossScaler, GradientOverflow, MinimumLossScaleError
from seqtrain.optim import loss_scaler as scaler_mod
from seqtrain.optim.loss_scaler import LossScalerConfig


def train_step(scaler, param, overflow):
    """What the trainer does per update: scaled backward, unscale, norm, overflow check, step or skip."""
    param.grad = None
    loss = (param * 2.0).sum()
    scaler.scale(loss).backward()
    if overflow:
        param.grad[0] = float("inf")  # injected fp16 overflow
    param.grad.div_(scaler.loss_scale)
    norm = torch.nn.utils.clip_grad_norm_([param], max_norm=float("inf"))
    try:
        scaler.check_overflow(norm)
    except GradientOverflow:
        return "skipped"
    scaler.update()
    return "stepped"


def test_default_flags_and_window():
    p = argparse.ArgumentParser()
    scaler_mod.add_args(p)
    args = p.parse_args([])
    assert (
        args.fp16_init_scale,
        args.fp16_scale_window,
        args.fp16_scale_tolerance,
        args.min_loss_scale,
        args.threshold_loss_scale,
    ) == (128, None, 0.0, 1e-4, None)
    s = DynamicLossScaler.from_config(from_args(LossScalerConfig, args), world_size=4, update_freq=2)
    assert s.loss_scale == 128.0 and s.scale_window == 2**14 // 8
    assert (
        DynamicLossScaler.from_config(
            from_args(LossScalerConfig, p.parse_args(["--fp16-scale-window", "7"]))
        ).scale_window
        == 7
    )


def test_scale_sequence_with_injected_overflows():
    s = DynamicLossScaler(init_scale=128.0, scale_window=3)
    param = torch.nn.Parameter(torch.ones(4))
    pattern = [False, False, False, True, False, True, True, False, False, False, False, False, False]
    results, scales = [], []
    for overflow in pattern:
        results.append(train_step(s, param, overflow))
        scales.append(s.loss_scale)
    assert results == ["skipped" if o else "stepped" for o in pattern]
    # 3 clean steps -> x2; each overflow -> /2 and restarts the count of clean steps
    assert scales == [128, 128, 256, 128, 128, 64, 32, 32, 32, 64, 64, 64, 128]
    assert param.grad is not None and torch.all(param.grad[1:] == 2.0)  # unscaled gradients are the true ones


def test_tolerance_allows_some_overflows_before_lowering():
    s = DynamicLossScaler(init_scale=64.0, scale_window=100, tolerance=0.25)
    for _ in range(4):
        s.update()
    # 1 overflow in 5 iterations since the last rescale (iteration -1): 1/5 < 0.25 keeps the scale
    with pytest.raises(GradientOverflow):
        s.check_overflow(float("inf"))
    assert s.loss_scale == 64.0
    with pytest.raises(GradientOverflow):
        s.check_overflow(float("nan"))  # 2/6 >= 0.25
    assert s.loss_scale == 32.0


def test_threshold_and_minimum_loss_scale():
    s = DynamicLossScaler(init_scale=4.0, scale_window=100, threshold=2.0)
    for expected in (2.0, 2.0, 2.0):
        with pytest.raises(GradientOverflow):
            s.check_overflow(overflow=True)
        assert s.loss_scale == expected

    s = DynamicLossScaler(init_scale=0.5, scale_window=100, min_loss_scale=0.2)
    with pytest.raises(GradientOverflow):
        s.check_overflow(torch.tensor(float("inf")))
    assert s.loss_scale == 0.25
    with pytest.raises(MinimumLossScaleError) as err:
        s.check_overflow(torch.tensor(float("inf")))
    assert isinstance(err.value, FloatingPointError) and isinstance(err.value, SeqtrainError)
    msg = str(err.value)
    assert "--min-loss-scale 0.2" in msg and "--bf16" in msg and "--lr" in msg and "--fp16-init-scale" in msg
    assert "\n" not in msg
    assert s.loss_scale == 0.25  # restored, as fairseq does
    s.check_overflow(3.5)  # a finite norm is not an overflow
    s.check_overflow(None)


def test_state_dict_round_trip_continues_identically():
    pattern = [False, True, False, False, True, False, False, False, False, False, True, False, False]
    param = torch.nn.Parameter(torch.ones(2))
    straight = DynamicLossScaler(init_scale=16.0, scale_window=2, tolerance=0.3)
    expected = []
    for o in pattern:
        train_step(straight, param, o)
        expected.append(straight.loss_scale)
    for cut in (3, 5, 8):
        a = DynamicLossScaler(init_scale=16.0, scale_window=2, tolerance=0.3)
        got = []
        for o in pattern[:cut]:
            train_step(a, param, o)
            got.append(a.loss_scale)
        state = a.state_dict()
        assert all(isinstance(v, (int, float)) for v in state.values())
        b = DynamicLossScaler(init_scale=16.0, scale_window=2, tolerance=0.3)
        b.load_state_dict(state)
        for o in pattern[cut:]:
            train_step(b, param, o)
            got.append(b.loss_scale)
        assert got == expected
    assert len(set(expected)) >= 3
