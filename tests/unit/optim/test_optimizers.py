import argparse
import io
import math

import numpy as np
import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.optim import optimizers as optim_mod
from seqtrain.optim import parse_lr_list
from seqtrain.registry import OPTIMIZERS
from tests.utils import optimizer_of


def parse(argv, name=None):
    p = argparse.ArgumentParser()
    optim_mod.add_args(p, name)
    return p.parse_args(argv)


def grads_at(step, shape):
    """Deterministic, varied gradients for step `step`."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def run(opt, params, steps, start=0, lr_at=None):
    for s in range(start, start + steps):
        if lr_at is not None and s in lr_at:
            opt.set_lr(lr_at[s])
        for i, p in enumerate(params):
            p.grad = grads_at(10 * s + i, p.shape)
        opt.step()


def test_parse_lr_list_forms():
    assert parse_lr_list("0.1") == [0.1]
    assert parse_lr_list("0.1,0.05") == [0.1, 0.05]
    assert parse_lr_list("[0.1, 0.05]") == [0.1, 0.05]
    assert parse_lr_list(3e-5) == [3e-5]
    assert parse(["--lr", "0.5,0.25"]).lr == [0.5, 0.25]
    with pytest.raises(SeqtrainError, match="--lr"):
        parse_lr_list("fast")


def test_union_flags_resolve_per_optimizer_defaults():
    args = parse([])
    assert args.momentum is None and args.optimizer == "adam" and args.lr == [0.25]
    p = [torch.nn.Parameter(torch.zeros(2))]
    args.optimizer = "nag"
    assert optimizer_of(args, p).param_groups[0]["momentum"] == 0.99
    args.optimizer = "sgd"
    assert optimizer_of(args, p).param_groups[0]["momentum"] == 0.0
    assert parse([], "nag").momentum == 0.99  # a named parser shows fairseq's real default
    assert set(OPTIMIZERS.names()) >= {"adam", "nag", "sgd", "adafactor"}


def test_nag_matches_fairseq_update_rule_with_lr_change():
    lr0, lr1, mom, wd = 0.1, 0.03, 0.9, 0.01
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    args = argparse.Namespace(optimizer="nag", lr=[lr0], momentum=mom, weight_decay=wd)
    opt = optimizer_of(args, [p])
    run(opt, [p], 5, lr_at={3: lr1})

    # fairseq's NAG by hand: buf holds -lr * velocity, rescaled by lr/lr_old when the lr changes
    w = np.array([1.0, -2.0, 0.5])
    buf = np.zeros(3)
    lr_old = lr0
    for s in range(5):
        lr = lr1 if s >= 3 else lr0
        g = grads_at(10 * s, (3,)).numpy()
        corr = lr / lr_old
        w = w * (1 - lr * wd)
        w = w + mom * mom * corr * buf - (1 + mom) * lr * g
        buf = mom * corr * buf - lr * g
        lr_old = lr
    np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-12, atol=1e-14)
    assert opt.get_lr() == lr1 and opt.param_groups[0]["lr_old"] == lr1


def test_adam_matches_torch_adamw():
    torch.manual_seed(0)
    init = [torch.randn(4, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    args = parse(
        [
            "--optimizer",
            "adam",
            "--lr",
            "0.01",
            "--adam-betas",
            "(0.8, 0.95)",
            "--adam-eps",
            "1e-6",
            "--weight-decay",
            "0.1",
        ]
    )
    opt = optimizer_of(args, ours)
    assert isinstance(opt.optimizer, torch.optim.AdamW)
    assert opt.optimizer.param_groups[0]["fused"] is True  # fused kernel on the CPU too (torch >= 2.4)
    ref_opt = torch.optim.AdamW(ref, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, foreach=False)
    for s in range(6):
        for i, (a, b) in enumerate(zip(ours, ref)):
            a.grad = grads_at(10 * s + i, a.shape)
            b.grad = grads_at(10 * s + i, b.shape)
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert not torch.equal(ours[0].detach(), init[0])
    with pytest.raises(SeqtrainError, match="--adam-betas"):
        optimizer_of(
            argparse.Namespace(optimizer="adam", lr=[1.0], adam_betas="0.9", adam_eps=1e-8, weight_decay=0.0),
            ours,
        )


def test_sgd_matches_torch_sgd():
    init = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    a, b = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    opt = optimizer_of(parse(["--optimizer", "sgd", "--lr", "0.2", "--momentum", "0.5", "--wd", "0.01"]), [a])
    ref = torch.optim.SGD([b], lr=0.2, momentum=0.5, weight_decay=0.01)
    for s in range(4):
        a.grad, b.grad = grads_at(s, a.shape), grads_at(s, b.shape)
        opt.step()
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-14, atol=0)


def adafactor_reference(
    w0,
    grad_fn,
    steps,
    lr,
    beta1=None,
    wd=0.0,
    scale_parameter=False,
    relative_step=False,
    warmup_init=False,
    eps=(1e-30, 1e-3),
    clip=1.0,
    decay=-0.8,
):
    """Adafactor written straight from the paper / fairseq's description, in numpy float64."""
    w = w0.copy()
    factored = w.ndim >= 2
    R = np.zeros(w.shape[:-1]) if factored else None
    C = np.zeros(w.shape[:-2] + w.shape[-1:]) if factored else None
    V = None if factored else np.zeros_like(w)
    m = np.zeros_like(w)
    for t in range(1, steps + 1):
        g = grad_fn(t - 1)
        rms_w = np.sqrt(np.mean(w**2))
        rho = min(1e-6 * t if warmup_init else 1e-2, 1 / math.sqrt(t)) if relative_step else lr
        alpha = (max(eps[1], rms_w) if scale_parameter else 1.0) * rho
        beta2 = 1 - t**decay
        sq = g**2 + eps[0]
        if factored:
            R = beta2 * R + (1 - beta2) * sq.mean(axis=-1)
            C = beta2 * C + (1 - beta2) * sq.mean(axis=-2)
            vhat = np.outer(R, C) / R.mean()
            u = g / np.sqrt(vhat)
        else:
            V = beta2 * V + (1 - beta2) * sq
            u = g / np.sqrt(V)
        u = u / max(1.0, np.sqrt(np.mean(u**2)) / clip)
        u = alpha * u
        if beta1 is not None:
            m = beta1 * m + (1 - beta1) * u
            u = m
        if wd:
            w = w - wd * alpha * w
        w = w - u
    return w


@pytest.mark.parametrize("shape", [(4, 3), (5,)])
@pytest.mark.parametrize(
    "flags",
    [
        dict(),
        dict(beta1=0.9, wd=0.01),
        dict(scale_parameter=True),
        dict(relative_step=True, scale_parameter=True),
        dict(relative_step=True, warmup_init=True),
    ],
)
def test_adafactor_matches_reference(shape, flags):
    torch.manual_seed(0)
    w0 = torch.randn(shape, dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone())
    argv = ["--optimizer", "adafactor", "--lr", "0.05"]
    if "beta1" in flags:
        argv += ["--beta1", str(flags["beta1"])]
    if "wd" in flags:
        argv += ["--weight-decay", str(flags["wd"])]
    for f in ("scale_parameter", "relative_step", "warmup_init"):
        if flags.get(f):
            argv.append("--" + f.replace("_", "-"))
    opt = optimizer_of(parse(argv), [p])
    run(opt, [p], 5)
    expected = adafactor_reference(w0.numpy(), lambda s: grads_at(10 * s, shape).numpy(), 5, lr=0.05, **flags)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    assert not np.allclose(expected, w0.numpy())
    state = opt.optimizer.state[p]
    assert ("exp_avg_sq_row" in state) == (len(shape) == 2) and state["step"] == 5


def test_adafactor_warmup_init_needs_relative_step():
    with pytest.raises(SeqtrainError, match="--warmup-init requires --relative-step"):
        optimizer_of(
            parse(["--optimizer", "adafactor", "--warmup-init"]), [torch.nn.Parameter(torch.ones(2))]
        )


@pytest.mark.parametrize("name", ["adam", "nag", "sgd", "adafactor"])
def test_state_dict_round_trip_continues_identically(name):
    torch.manual_seed(0)
    init = [torch.randn(3, 2, dtype=torch.float64), torch.randn(2, dtype=torch.float64)]
    extra = {
        "adam": ["--wd", "0.1"],
        "nag": ["--momentum", "0.9"],
        "sgd": ["--momentum", "0.9"],
        "adafactor": ["--beta1", "0.9"],
    }[name]
    args = parse(["--optimizer", name, "--lr", "0.05"] + extra)

    straight = [torch.nn.Parameter(t.clone()) for t in init]
    opt = optimizer_of(args, straight)
    run(opt, straight, 6, lr_at={4: 0.02})

    first = [torch.nn.Parameter(t.clone()) for t in init]
    opt1 = optimizer_of(args, first)
    run(opt1, first, 3)
    buf = io.BytesIO()
    torch.save(opt1.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # plain data only
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = optimizer_of(args, resumed)
    opt2.load_state_dict(state)
    run(opt2, resumed, 3, start=3, lr_at={4: 0.02})
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_load_state_dict_overrides_and_grad_helpers():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = optimizer_of(argparse.Namespace(optimizer="sgd", lr=[0.1], momentum=0.0, weight_decay=0.0), [p])
    opt.load_state_dict(opt.state_dict(), optimizer_overrides={"lr": 0.5})
    assert opt.get_lr() == 0.5
    p.grad = torch.tensor([3.0, 4.0])
    opt.multiply_grads(2.0)
    assert p.grad.tolist() == [6.0, 8.0]
    norm = opt.clip_grad_norm(5.0)
    assert norm.item() == pytest.approx(10.0)
    assert p.grad.norm().item() == pytest.approx(5.0, rel=1e-5)
    assert opt.clip_grad_norm(0.0).item() == pytest.approx(5.0, rel=1e-5)  # 0 = measure only


def test_frozen_parameters_are_left_out():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opt = optimizer_of(argparse.Namespace(optimizer="nag", lr=[0.1], momentum=0.9, weight_decay=0.0), [a, b])
    assert opt.param_groups[0]["params"] == [a]


@pytest.mark.cuda
def test_adam_uses_fused_kernel_on_cuda():
    p = torch.nn.Parameter(torch.randn(8, device="cuda"))
    ref = torch.nn.Parameter(p.detach().clone())
    opt = optimizer_of(
        argparse.Namespace(
            optimizer="adam", lr=[1e-2], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.01
        ),
        [p],
    )
    assert opt.param_groups[0]["fused"] is True
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01, foreach=False)
    for _s in range(3):
        g = torch.randn(8, device="cuda")
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(p, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["nag", "adafactor"])
def test_bf16_params_keep_fp32_state_across_resume(name):
    p = torch.nn.Parameter(torch.randn(3, 2).to(torch.bfloat16))
    args = argparse.Namespace(
        optimizer=name,
        lr=[0.1],
        momentum=0.9,
        weight_decay=0.0,
        adafactor_eps="(1e-30, 1e-3)",
        clip_threshold=1.0,
        decay_rate=-0.8,
        beta1=0.9,
        scale_parameter=False,
        relative_step=False,
        warmup_init=False,
    )
    opt = optimizer_of(args, [p])
    p.grad = torch.randn(3, 2).to(torch.bfloat16)
    opt.step()
    opt2 = optimizer_of(args, [p])
    opt2.load_state_dict(opt.state_dict())
    key = "momentum_buffer" if name == "nag" else "exp_avg"
    assert opt2.optimizer.state[p][key].dtype == torch.float32
    assert torch.equal(opt2.optimizer.state[p][key], opt.optimizer.state[p][key])


def _adam(lr=1e-2):
    p = torch.nn.Parameter(torch.zeros(2))
    args = argparse.Namespace(
        optimizer="adam", lr=[lr], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.0
    )
    return optimizer_of(args, [p])


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([1], "--optimizer-overrides: not a JSON object: [1]"),
        ({"betas": 5}, "--optimizer-overrides: betas=5 does not fit the optimizer's betas=(0.9, 0.98)"),
        (
            {"betas": [0.9]},
            "--optimizer-overrides: betas=[0.9] does not fit the optimizer's betas=(0.9, 0.98)",
        ),
        ({"betas": [0.9, 1.5]}, "--optimizer-overrides: betas=[0.9, 1.5]: each must be in [0, 1)"),
        ({"lr": "fast"}, "--optimizer-overrides: lr='fast' does not fit the optimizer's lr=0.01"),
        ({"lr": float("nan")}, "--optimizer-overrides: lr=nan does not fit the optimizer's lr=0.01"),
        ({"lr": 1e9}, "--optimizer-overrides: lr=1000000000.0: must be between 0 and 1000, got 1000000000"),
        ({"eps": 0}, "--optimizer-overrides: eps=0: must be above 0 and at most 1, got 0"),
        ({"amsgrad": 1}, "--optimizer-overrides: amsgrad=1 does not fit the optimizer's amsgrad=False"),
        (
            {"lrr": 0.1},
            "--optimizer-overrides: 'lrr' is no setting of this optimizer (it has: amsgrad, betas,",
        ),
    ],
)
def test_optimizer_overrides_are_checked_against_the_optimizer(overrides, message):
    """Before (issue 31): '[1]' and '{"betas": 5}' were applied as given and a resumed run ended in a
    TypeError traceback (dict.update of a list; unpacking an int at the first Adam step); NaN and unknown
    names went in silently. Nothing is replaced when one is refused."""
    opt = _adam()
    before = dict(opt.param_groups[0], params=None)
    with pytest.raises(SeqtrainError) as e:
        opt.load_state_dict(opt.state_dict(), optimizer_overrides=overrides)
    assert str(e.value).startswith(message), str(e.value)
    assert dict(opt.param_groups[0], params=None) == before


def test_optimizer_overrides_that_fit_are_applied():
    opt = _adam()
    opt.load_state_dict(
        opt.state_dict(), optimizer_overrides={"lr": 5e-4, "betas": [0.8, 0.9], "weight_decay": 1}
    )
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (5e-4, (0.8, 0.9), 1)
