import argparse
import math
import re

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.optim import lr_scheduler as sched_mod
from seqtrain.optim import optimizers as optim_mod
from seqtrain.registry import LR_SCHEDULERS
from tests.utils import optimizer_of, scheduler_of


def setup(name, argv, max_update=0):
    p = argparse.ArgumentParser()
    optim_mod.add_args(p, "sgd")
    sched_mod.add_args(p, name)
    args = p.parse_args(["--lr-scheduler", name] + argv)
    args.max_update = max_update
    opt = optimizer_of(args, [torch.nn.Parameter(torch.zeros(1))])
    return args, opt, scheduler_of(args, opt)


def test_registry_and_unknown_name():
    assert set(LR_SCHEDULERS.names()) >= {
        "fixed",
        "inverse_sqrt",
        "polynomial_decay",
        "reduce_lr_on_plateau",
        "cosine",
    }
    with pytest.raises(
        SeqtrainError, match="--lr-scheduler: unknown lr scheduler 'linear'; choose from: cosine"
    ):
        scheduler_of(argparse.Namespace(lr_scheduler="linear", lr=[1.0]), None)


def test_fixed_one_lr_per_epoch_then_last():
    _, opt, s = setup("fixed", ["--lr", "1.0,0.5,0.25"])
    for epoch in range(1, 6):
        assert s.step_begin_epoch(epoch) == [1.0, 0.5, 0.25][min(epoch - 1, 2)]
        assert s.step_update(epoch * 10) == opt.get_lr() == [1.0, 0.5, 0.25][min(epoch - 1, 2)]


def test_fixed_force_anneal():
    _, _, s = setup("fixed", ["--lr", "1.0,0.5", "--force-anneal", "3", "--lr-shrink", "0.1"])
    for epoch in range(1, 7):
        expected = [1.0, 0.5][min(epoch - 1, 1)] if epoch < 3 else 0.5 * 0.1 ** (epoch + 1 - 3)
        assert s.step_begin_epoch(epoch) == pytest.approx(expected, rel=1e-12)


def test_fixed_warmup():
    _, opt, s = setup("fixed", ["--lr", "0.8", "--warmup-updates", "4"])
    assert s.step_update(0) == pytest.approx(0.2)
    assert s.step_begin_epoch(1) == pytest.approx(0.2)
    for n in range(1, 9):
        assert s.step_update(n) == pytest.approx(0.8 * (n + 1) / 4 if n < 4 else 0.8)


@pytest.mark.parametrize("init", [None, 1e-4])
def test_inverse_sqrt(init):
    lr, w = 1e-3, 4
    argv = ["--lr", str(lr), "--warmup-updates", str(w)] + (
        [] if init is None else ["--warmup-init-lr", str(init)]
    )
    _, opt, s = setup("inverse_sqrt", argv)
    start = 0.0 if init is None else init
    assert opt.get_lr() == start
    for n in range(0, 20):
        expected = start + n * (lr - start) / w if n < w else lr * math.sqrt(w) / math.sqrt(n)
        assert s.step_update(n) == pytest.approx(expected, rel=1e-12)
    assert s.step(1, 3.0) == pytest.approx(lr * 2 / math.sqrt(19))  # epochs don't move it
    with pytest.raises(SeqtrainError, match="--warmup-updates must be > 0"):
        setup("inverse_sqrt", ["--lr", "1", "--warmup-updates", "0"])
    with pytest.raises(SeqtrainError, match="takes one learning rate"):
        setup("inverse_sqrt", ["--lr", "1,2"])


def test_polynomial_decay():
    lr, end, w, total, power = 1e-3, 1e-5, 10, 50, 2.0
    _, opt, s = setup(
        "polynomial_decay",
        [
            "--lr",
            str(lr),
            "--end-learning-rate",
            str(end),
            "--warmup-updates",
            str(w),
            "--total-num-update",
            str(total),
            "--power",
            str(power),
        ],
    )
    assert opt.get_lr() == pytest.approx(lr / w)
    for n in range(0, 60):
        if n <= w:
            expected = lr * n / w
        elif n >= total:
            expected = end
        else:
            expected = (lr - end) * (1 - (n - w) / (total - w)) ** power + end
        assert s.step_update(n) == pytest.approx(expected, rel=1e-12, abs=1e-18)
    with pytest.raises(SeqtrainError, match="--total-num-update"):
        setup("polynomial_decay", ["--lr", "1"])
    _, _, s2 = setup("polynomial_decay", ["--lr", "1"], max_update=100)  # falls back to --max-update
    assert s2.total_num_update == 100 and s2.step_update(25) == pytest.approx(0.75)


def test_polynomial_decay_matches_fairseq_train_log(fairseq_tiny):
    """fairseq 0.12 trained the fixture with --lr 1e-3 --warmup-updates 10 --total-num-update 300."""
    _, _, s = setup(
        "polynomial_decay", ["--lr", "1e-3", "--warmup-updates", "10", "--total-num-update", "300"]
    )
    log = (fairseq_tiny / "train.log").read_text()
    pairs = re.findall(r"num_updates[= ](\d+)[,| ]+lr[= ]([0-9.e-]+)", log)
    assert len(pairs) >= 20
    for n, logged in pairs:
        assert s.step_update(int(n)) == pytest.approx(float(logged), rel=1e-5), n


def test_reduce_lr_on_plateau_minimize():
    _, opt, s = setup(
        "reduce_lr_on_plateau",
        ["--lr", "1.0", "--lr-shrink", "0.5", "--lr-patience", "1", "--lr-threshold", "0.01"],
    )
    losses = [10, 9.95, 9.95, 9.0, 9.0, 8.95, 5.0]
    # rule: improved iff loss < best * (1 - 0.01); shrink when more than 1 epoch in a row did not improve
    expected = [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    got = [s.step(e + 1, loss) for e, loss in enumerate(losses)]
    assert got == pytest.approx(expected)
    assert s.best == 5.0


def test_reduce_lr_on_plateau_maximize_and_warmup():
    args, opt, s = setup(
        "reduce_lr_on_plateau",
        ["--lr", "1.0", "--lr-shrink", "0.5", "--lr-patience", "0", "--lr-threshold", "0.01"],
    )
    args.maximize_best_checkpoint_metric = True
    s = scheduler_of(args, opt)
    assert [s.step(1, 10.0), s.step(2, 10.05), s.step(3, 20.0)] == pytest.approx([1.0, 0.5, 0.5])

    _, opt, s = setup("reduce_lr_on_plateau", ["--lr", "1.0", "--warmup-updates", "4"])
    assert [s.step_update(n) for n in range(0, 5)] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert s.step(1, 5.0) == 1.0 and s.step(2, 6.0) == 1.0  # still warming up: val loss ignored
    s.step_update(5)
    assert s.step(3, 7.0) == 1.0 and s.step(4, 7.0) == pytest.approx(0.1)


def cosine_expected(n, lo, hi, w, init, period, t_mult, shrink):
    if n < w:
        return init + n * (hi - init) / w
    cur, start, t_i, i = n - w, 0.0, period, 0
    while cur >= start + t_i:  # walk the periods instead of fairseq's closed-form log
        start, t_i, i = start + t_i, t_i * t_mult, i + 1
    lo_i, hi_i = lo * shrink**i, hi * shrink**i
    return lo_i + 0.5 * (hi_i - lo_i) * (1 + math.cos(math.pi * (cur - start) / t_i))


@pytest.mark.parametrize("t_mult", [1.0, 2.0])
def test_cosine(t_mult):
    argv = [
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-5",
        "--warmup-updates",
        "5",
        "--lr-period-updates",
        "10",
        "--t-mult",
        str(t_mult),
        "--lr-shrink",
        "0.5",
    ]
    _, opt, s = setup("cosine", argv)
    assert opt.get_lr() == 1e-5
    for n in range(0, 5 + 69):
        assert s.step_update(n) == pytest.approx(
            cosine_expected(n, 1e-5, 1e-3, 5, 1e-5, 10, t_mult, 0.5), rel=1e-9
        ), n


def test_cosine_legacy_max_lr_and_max_update_period():
    _, _, s = setup("cosine", ["--lr", "1e-5", "--max-lr", "1e-3"], max_update=20)
    assert (s.min_lr, s.max_lr, s.period) == (1e-5, 1e-3, 20)
    for n in range(0, 40):
        assert s.step_update(n) == pytest.approx(
            cosine_expected(n, 1e-5, 1e-3, 0, 1e-5, 20, 1.0, 0.1), rel=1e-9
        )
    with pytest.raises(SeqtrainError, match="--lr-period-updates or --max-update"):
        setup("cosine", ["--lr", "1e-3"])


def events(n_epochs=3, per_epoch=7):
    out = [("update", 0)]
    n = 0
    for epoch in range(1, n_epochs + 1):
        out.append(("begin", epoch))
        for _ in range(per_epoch):
            n += 1
            out.append(("update", n))
        out.append(("end", epoch, [3.0, 3.0, 2.0][epoch - 1]))
    return out


def drive(s, evs):
    lrs = []
    for ev in evs:
        if ev[0] == "update":
            s.step_update(ev[1])
        elif ev[0] == "begin":
            s.step_begin_epoch(ev[1])
        else:
            s.step(ev[1], ev[2])
        lrs.append(s.optimizer.get_lr())
    return lrs


@pytest.mark.parametrize(
    "name,argv",
    [
        ("fixed", ["--lr", "1,0.5", "--warmup-updates", "10", "--force-anneal", "3"]),
        ("inverse_sqrt", ["--lr", "1", "--warmup-updates", "5"]),
        (
            "polynomial_decay",
            ["--lr", "1", "--warmup-updates", "3", "--total-num-update", "18", "--power", "0.5"],
        ),
        ("reduce_lr_on_plateau", ["--lr", "1", "--warmup-updates", "3", "--lr-patience", "0"]),
        ("cosine", ["--lr", "1", "--warmup-updates", "3", "--lr-period-updates", "5", "--t-mult", "2"]),
    ],
)
def test_state_dict_round_trip_continues_identically(name, argv):
    evs = events()
    _, _, straight = setup(name, argv)
    expected = drive(straight, evs)
    for cut in (5, 9, 12, 20):
        _, opt, s = setup(name, argv)
        first = drive(s, evs[:cut])
        saved_sched, saved_opt = s.state_dict(), opt.state_dict()
        _, opt2, s2 = setup(name, argv)  # fresh objects, as after a restart
        opt2.load_state_dict(saved_opt)
        s2.load_state_dict(saved_sched)
        assert first + drive(s2, evs[cut:]) == expected, cut
    assert len(set(expected)) > 3  # the schedule actually moved
