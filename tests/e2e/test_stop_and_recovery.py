"""Reliability: graceful stop on SIGTERM / SIGINT, checkpoint writes that fail (disk full, permission denied),
damaged checkpoints at start-up, NaN / inf losses (fp32 and the fp16 loss scaler), and safe loading of crafted
checkpoints through every CLI. Tiny bart models on a 120-example toy data-bin; everything on CPU."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from seqtrain.checkpoint.files import load_checkpoint_file
from seqtrain.errors import SeqtrainError
from seqtrain.optim import DynamicLossScaler, MinimumLossScaleError
from seqtrain.train import loop as train_loop
from seqtrain.train.program import train_config
from seqtrain.train.stop_signals import GracefulStop
from seqtrain.train.trainer import Trainer
from seqtrain_cli.train import cli_main, train_main
from tests.utils import REPO, assert_same_state


@pytest.fixture(scope="module")
def databin(toy_databin):
    # 120 examples at --max-tokens 256: 5 updates an epoch
    return toy_databin(n_train=120, n_valid=16)


def targs(data: str, save_dir: str, *extra: str) -> list:
    # 120 examples at --max-tokens 256: 5 updates an epoch; dropout on, so resume must restore the RNG stream
    return [
        data,
        "--arch",
        "bart_tiny",
        "--encoder-layers",
        "1",
        "--decoder-layers",
        "1",
        "--cpu",
        "--seed",
        "5",
        "--lr",
        "3e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "3",
        "--max-tokens",
        "256",
        "--criterion",
        "cross_entropy",
        "--log-format",
        "none",
        "--save-dir",
        save_dir,
        "--no-epoch-checkpoints",
        "--max-update",
        "8",
        *extra,
    ]


def sha(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def updates_in(path: str) -> int:
    return int(load_checkpoint_file(path)["extra_state"]["num_updates"])


@pytest.fixture(scope="module")
def uninterrupted(databin, tmp_path_factory):
    save_dir = str(tmp_path_factory.mktemp("full"))
    assert (
        train_main(targs(databin, save_dir, "--save-interval-updates", "1", "--keep-interval-updates", "8"))
        == 0
    )
    return save_dir


def run_cli(main, argv, capsys) -> tuple:
    """(exit code, stderr) of a console-script main run in-process."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ graceful stop
def stop_at_update(monkeypatch, update: int, signum: int) -> None:
    """Deliver `signum` to this process while update `update` is being computed."""
    real = Trainer.train_step

    def train_step(self, samples):
        if self.get_num_updates() + 1 == update:
            signal.raise_signal(signum)  # arrives mid-update; the update must still complete
        return real(self, samples)

    monkeypatch.setattr(Trainer, "train_step", train_step)


@pytest.mark.parametrize(
    "signum,update,where,flags",
    [
        (
            signal.SIGTERM,
            3,
            (1, 3),
            ("--save-interval-updates", "2"),
        ),  # mid-epoch, between two interval saves
        # the last update of epoch 1 (4 batches), where the policy saves nothing (--save-interval 2): the stop
        # writes checkpoint_last.pt at the epoch's end, after its lr step, and the restart begins epoch 2
        (signal.SIGINT, 4, (2, 0), ("--save-interval", "2")),
    ],
    ids=["sigterm-mid-epoch", "sigint-epoch-end"],
)
def test_graceful_stop_saves_exact_position_and_resumes_bitwise(
    databin, uninterrupted, tmp_path, monkeypatch, caplog, python_sigint, signum, update, where, flags
):
    save_dir = str(tmp_path / "stopped")
    with monkeypatch.context() as m:
        stop_at_update(m, update, signum)
        rc = train_main(targs(databin, save_dir, *flags))
    assert rc == 128 + signum  # 143 for SIGTERM, 130 for SIGINT
    name = signal.Signals(signum).name
    assert f"stopped by {name} after update {update}: saved" in caplog.text
    last = load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))
    itr = last["extra_state"]["train_iterator"]
    assert last["extra_state"]["num_updates"] == update
    assert (itr["epoch"], itr["iterations_in_epoch"]) == where
    assert signal.getsignal(signal.SIGINT) is not None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert train_main(targs(databin, save_dir, *flags)) == 0  # the same command continues
    assert_same_state(
        load_checkpoint_file(os.path.join(uninterrupted, "checkpoint_last.pt")),
        load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt")),
    )


def test_graceful_stop_second_signal_acts_at_once(python_sigint):
    previous = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGINT)
        assert stop.requested and stop.exit_code == 130 and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the previous handler (Python's: KeyboardInterrupt) is back
    assert signal.getsignal(signal.SIGINT) is previous


def test_ignored_signal_stays_ignored():
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with GracefulStop() as stop:
            signal.raise_signal(signal.SIGINT)
            assert not stop.requested and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_sigterm_to_the_console_script(databin, tmp_path):
    """A real SIGTERM from outside, to the seqtrain-train process, while it trains."""
    save_dir = str(tmp_path / "ck")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    argv = targs(
        databin,
        save_dir,
        "--max-update",
        "400",
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--disable-validation",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqtrain_cli.train", *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "num_updates=2," in line or "num_updates 2 " in line or "train_inner" in line:
            proc.send_signal(signal.SIGTERM)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(60) == 143, "".join(lines[-20:])
    stopped = [ln for ln in lines if "stopped by SIGTERM after update" in ln]
    assert len(stopped) == 1 and "run the same command to continue (exit code 143)" in stopped[0]
    n = int(stopped[0].split("after update ")[1].split(":")[0])
    assert 1 <= n < 400 and updates_in(os.path.join(save_dir, "checkpoint_last.pt")) == n


# ------------------------------------------------------------------------------------------------ failed writes
def fail_nth_save(monkeypatch, n: int, error: OSError) -> None:
    """torch.save writes half the bytes of its n-th call, then fails like a full disk would."""
    real = torch.save
    calls = [0]

    def save(obj, f, *a, **k):
        calls[0] += 1
        if calls[0] < n:
            return real(obj, f, *a, **k)
        buf = io.BytesIO()
        real(obj, buf, *a, **k)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise error

    monkeypatch.setattr(torch, "save", save)


def fail_nth_rename(monkeypatch, n: int, error: OSError) -> None:
    real = os.replace
    calls = [0]

    def replace(src, dst, *a, **k):
        if os.path.basename(str(dst)).startswith("checkpoint"):
            calls[0] += 1
            if calls[0] >= n:
                raise error
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)


ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EACCES = PermissionError(errno.EACCES, "Permission denied")


# Saves at updates 2 and 4 succeed, the one at update 6 fails: its torch.save (3rd), the rename of its file into
# place (4th rename: update 2 renames checkpoint_1_2.pt and its checkpoint_last.pt link, the epoch end at update 4
# only checkpoint_last.pt), or the link of checkpoint_last.pt to the new, complete checkpoint_2_6.pt (5th).
@pytest.mark.parametrize(
    "how,n,error,new_file",
    [
        ("save", 3, ENOSPC, None),
        ("rename", 4, EACCES, None),
        ("rename", 5, EACCES, "checkpoint_2_6.pt"),
    ],
    ids=["disk-full", "permission-denied", "permission-denied-on-link"],
)
def test_failed_checkpoint_write_keeps_previous_and_stops_clearly(
    databin, tmp_path, monkeypatch, capsys, how, n, error, new_file
):
    save_dir = str(tmp_path / "ck")
    argv = targs(databin, save_dir, "--save-interval-updates", "2", "--disable-validation")
    text = error.strerror
    (fail_nth_save if how == "save" else fail_nth_rename)(monkeypatch, n, error)
    snapshot = {}
    real_train_step = Trainer.train_step

    def train_step(self, samples):
        if self.get_num_updates() == 5:  # just before the failing save: remember the files as they are
            names = [n for n in os.listdir(save_dir) if n != ".seqtrain.lock"]  # the run's own lock, released
            snapshot.update({n: sha(os.path.join(save_dir, n)) for n in names})
        return real_train_step(self, samples)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    code, err = run_cli(cli_main, argv, capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("seqtrain-train: error: could not write checkpoint ")
    assert (
        "at update 6" in lines[0]
        and text in lines[0]
        and "checkpoint_last.pt (update 4) is intact" in lines[0]
    )
    after = {n: sha(os.path.join(save_dir, n)) for n in os.listdir(save_dir)}
    if new_file is not None:  # a complete new checkpoint may have been written before the link failed
        assert updates_in(os.path.join(save_dir, new_file)) == 6
        del after[new_file]
    assert after == snapshot  # nothing that existed changed
    assert not [n for n in os.listdir(save_dir) if n.startswith(".")]  # no temporary file left behind
    assert updates_in(os.path.join(save_dir, "checkpoint_last.pt")) == 4


def test_unwritable_save_dir_fails_at_start(databin, tmp_path, monkeypatch, capsys):
    # tests run as root, where chmod does not stop writes: refuse file creation in --save-dir instead
    save_dir = str(tmp_path / "ro")
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and os.path.abspath(dir) == os.path.abspath(save_dir):
            raise PermissionError(errno.EACCES, "Permission denied", dir)
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    code, err = run_cli(cli_main, targs(databin, save_dir), capsys)
    assert code == 1 and err.strip() == (
        f"seqtrain-train: error: --save-dir {save_dir}: cannot write checkpoints "
        "there (Permission denied); pass a writable --save-dir or --no-save"
    )


# ------------------------------------------------------------------------------------------------ damaged files
@pytest.mark.parametrize("damage", ["truncate", "flip-a-byte"])
def test_damaged_checkpoint_last_names_newest_intact(databin, uninterrupted, tmp_path, capsys, damage):
    save_dir = str(tmp_path / "ck")
    shutil.copytree(uninterrupted, save_dir)
    for n in os.listdir(save_dir):
        if n.startswith("checkpoint_1_") or n == "checkpoint_best.pt":
            os.remove(os.path.join(save_dir, n))
    last = os.path.join(save_dir, "checkpoint_last.pt")
    os.remove(last)  # as if killed after update 7: checkpoint_last.pt is a hard link to checkpoint_2_7.pt
    os.link(os.path.join(save_dir, "checkpoint_2_7.pt"), last)
    data = bytearray(open(last, "rb").read())
    with open(last, "r+b") as f:  # damage in place, so the linked checkpoint_2_7.pt is damaged too
        if damage == "truncate":
            f.truncate(len(data) // 3)
        else:
            f.seek(len(data) // 2)
            f.write(bytes([data[len(data) // 2] ^ 0xFF]))
    before = {n: sha(os.path.join(save_dir, n)) for n in os.listdir(save_dir)}
    code, err = run_cli(cli_main, targs(databin, save_dir, "--max-update", "10"), capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    intact = os.path.join(save_dir, "checkpoint_2_6.pt")
    problem = "truncated (no zip central directory)" if damage == "truncate" else "corrupted (record "
    assert err.startswith(f"seqtrain-train: error: {last} is {problem}"), err
    assert err.strip().endswith(
        f"; the newest intact checkpoint is {intact}: resume from it with --restore-file "
        f"{intact} (or copy it over checkpoint_last.pt)"
    ), err
    if damage != "truncate":
        assert "fails its checksum" in err  # torch.load alone would have loaded the flipped byte silently
    assert {n: sha(os.path.join(save_dir, n)) for n in os.listdir(save_dir)} == before
    # following the advice works: it resumes at update 6 and trains on
    assert train_main(targs(databin, save_dir, "--max-update", "9", "--restore-file", intact)) == 0
    assert updates_in(last) == 9


def test_damaged_checkpoint_last_without_alternative(databin, tmp_path, capsys):
    save_dir = tmp_path / "ck"
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    code, err = run_cli(cli_main, targs(databin, str(save_dir)), capsys)
    assert code == 1 and err.strip().endswith(
        f"no intact checkpoint in {save_dir}; move the damaged file away to start from scratch"
    )


# ------------------------------------------------------------------------------------------------ NaN / inf
def poison_criterion(trainer: Trainer, bad_calls: set, value: float) -> None:
    """Multiply the loss by `value` (nan or inf) on the given (1-based) criterion calls."""
    crit = trainer.criterion
    real = crit.forward
    calls = [0]

    def forward(model, sample, reduce=True):
        calls[0] += 1
        loss, size, log = real(model, sample, reduce)
        if calls[0] in bad_calls:
            loss = loss * value
            log = dict(log, loss=log["loss"] * value)
        return loss, size, log

    crit.forward = forward


def make_trainer(databin: str, tmp_path, *extra: str) -> tuple:
    from seqtrain.flags import parsing, training
    from seqtrain.tasks import setup_task

    cfg = train_config(
        parsing.parse_args_and_arch(training.get_training_parser(), targs(databin, str(tmp_path), *extra))
    )
    task = setup_task(cfg.task)
    task.load_dataset("train")
    trainer = train_loop.build_trainer(
        cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    )
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=256, seed=1).next_epoch_itr(shuffle=False)
    return trainer, [next(itr) for _ in range(4)]


def params(trainer: Trainer) -> dict:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_fp32_nonfinite_loss_stops_naming_the_update(databin, tmp_path, value):
    trainer, batches = make_trainer(databin, tmp_path)
    poison_criterion(trainer, {3}, value)
    assert trainer.train_step([batches[0]]) is not None and trainer.train_step([batches[1]]) is not None
    before = params(trainer)
    with pytest.raises(SeqtrainError) as e:
        trainer.train_step([batches[2]])
    msg = str(e.value)
    assert msg.startswith(
        f"loss is {value} at update 3: training diverged (the last good update is 2); resume from the last "
        "checkpoint"
    )
    assert "--lr" in msg and "--clip-norm" in msg and "\n" not in msg
    after = params(trainer)
    assert trainer.get_num_updates() == 2 and all(torch.equal(before[k], after[k]) for k in before)


def test_weights_made_inf_by_the_optimizer_step_name_the_update_before(databin, tmp_path):
    """An infinite learning rate in update 3 makes the weights inf; update 4's loss is NaN, and the error names
    update 2 as the last good one (not 3, whose loss and gradients were finite)."""
    trainer, batches = make_trainer(databin, tmp_path)
    assert trainer.train_step([batches[0]]) is not None and trainer.train_step([batches[1]]) is not None
    trainer.optimizer.set_lr(float("inf"))
    assert trainer.train_step([batches[2]]) is not None  # finite loss and gradients, inf weights after it
    with pytest.raises(SeqtrainError) as e:
        trainer.train_step([batches[3]])
    assert str(e.value).startswith(
        "loss is nan at update 4: training diverged (the weights became inf/NaN in update 3's optimizer step; "
        "the last good update is 2)"
    )


def test_inf_starting_weights_are_named_as_such(databin, tmp_path):
    trainer, batches = make_trainer(databin, tmp_path)
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("inf"))
    with pytest.raises(SeqtrainError) as e:
        trainer.train_step([batches[0]])
    assert "at update 1: training diverged (the starting weights are inf/NaN: no update was good)" in str(
        e.value
    )


def test_fp32_nonfinite_loss_through_the_cli(databin, tmp_path, monkeypatch, capsys):
    from seqtrain.criterions.cross_entropy import CrossEntropyCriterion

    real = CrossEntropyCriterion.forward
    calls = [0]

    def forward(self, model, sample, reduce=True):
        calls[0] += 1
        loss, size, log = real(self, model, sample, reduce)
        return (
            (loss * float("nan"), size, dict(log, loss=log["loss"] * float("nan")))
            if calls[0] == 4
            else (loss, size, log)
        )

    monkeypatch.setattr(CrossEntropyCriterion, "forward", forward)
    save_dir = str(tmp_path / "ck")
    code, err = run_cli(
        cli_main, targs(databin, save_dir, "--save-interval-updates", "2", "--disable-validation"), capsys
    )
    assert code == 1 and err.startswith("seqtrain-train: error: loss is nan at update 4: training diverged")
    assert updates_in(os.path.join(save_dir, "checkpoint_last.pt")) == 2  # the last good state is kept


def test_fp16_overflow_lowers_scale_and_skips_update(databin, tmp_path):
    """fp16 autocast needs CUDA; the loss-scaling logic is the same on CPU with the scaler attached by hand."""
    trainer, batches = make_trainer(databin, tmp_path)
    trainer.scaler = DynamicLossScaler(init_scale=2.0**7, scale_window=100, min_loss_scale=1e-4)
    poison_criterion(trainer, {2, 3}, float("inf"))
    assert trainer.train_step([batches[0]]) is not None and trainer.get_num_updates() == 1
    before = params(trainer)
    assert trainer.train_step([batches[1]]) is None and trainer.scaler.loss_scale == 2.0**6
    assert trainer.train_step([batches[1]]) is None and trainer.scaler.loss_scale == 2.0**5
    after = params(trainer)
    assert trainer.get_num_updates() == 1 and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None or not p.grad.abs().sum() for p in trainer.model.parameters())  # grads cleared
    assert trainer.train_step([batches[1]]) is not None and trainer.get_num_updates() == 2  # and it trains on
    assert trainer.state_dict()["loss_scaler"]["loss_scale"] == 2.0**5


def test_fp16_real_overflow_from_a_huge_scale(databin, tmp_path):
    # 2**140 overflows fp32 itself: the scaled loss is inf until the scale has come down far enough
    trainer, batches = make_trainer(databin, tmp_path)
    trainer.scaler = DynamicLossScaler(init_scale=2.0**140, scale_window=100)
    skipped = 0
    while trainer.train_step([batches[0]]) is None:
        skipped += 1
        assert skipped < 30
    assert skipped >= 13 and trainer.scaler.loss_scale == 2.0 ** (140 - skipped)
    assert trainer.get_num_updates() == 1


def test_fp16_min_loss_scale_is_a_clear_error(databin, tmp_path):
    trainer, batches = make_trainer(databin, tmp_path)
    trainer.scaler = DynamicLossScaler(init_scale=8.0, scale_window=100, min_loss_scale=1.0)
    poison_criterion(trainer, set(range(1, 10)), float("inf"))
    assert (
        trainer.train_step([batches[0]]) is None and trainer.train_step([batches[0]]) is None
    )  # 8 -> 4 -> 2
    with pytest.raises(MinimumLossScaleError) as e:
        trainer.train_step([batches[0]])
    assert isinstance(e.value, SeqtrainError)
    assert str(e.value).startswith("minimum loss scale reached (--min-loss-scale 1.0)")
    assert trainer.get_num_updates() == 0


@pytest.mark.cuda
def test_fp16_overflow_on_cuda(databin, tmp_path, monkeypatch):
    from seqtrain.criterions.cross_entropy import CrossEntropyCriterion

    real = CrossEntropyCriterion.forward
    calls = [0]

    def forward(self, model, sample, reduce=True):
        calls[0] += 1
        loss, size, log = real(self, model, sample, reduce)
        return (loss * float("inf"), size, log) if calls[0] in (3, 4) else (loss, size, log)

    monkeypatch.setattr(CrossEntropyCriterion, "forward", forward)
    save_dir = str(tmp_path / "ck")
    argv = [
        a
        for a in targs(databin, save_dir, "--fp16", "--fp16-init-scale", "128", "--disable-validation")
        if a != "--cpu"
    ]
    assert train_main(argv) == 0
    state = load_checkpoint_file(os.path.join(save_dir, "checkpoint_last.pt"))
    assert state["extra_state"]["num_updates"] == 8 and calls[0] == 10  # two skipped updates redone
    assert state["loss_scaler"]["loss_scale"] == 32.0


# ------------------------------------------------------------------------------------------------ safe loading
class _Marker:
    """Unpickling this runs os.mkdir(path): the 'code' a malicious checkpoint would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def evil(databin, uninterrupted, tmp_path_factory):
    """A working seqtrain checkpoint that also runs code when fully unpickled."""
    folder = tmp_path_factory.mktemp("evil")
    state = load_checkpoint_file(os.path.join(uninterrupted, "checkpoint_last.pt"))
    marker = str(folder / "code-ran")
    state["extra_state"]["payload"] = _Marker(marker)
    path = str(folder / "evil.pt")
    torch.save(state, path)
    return path, marker


def cli(name: str):
    import importlib

    return importlib.import_module(f"seqtrain_cli.{name}").cli_main


@pytest.mark.parametrize("tool", ["train-restore", "train-finetune", "generate", "convert"])
def test_crafted_checkpoint_refused_by_every_cli(databin, evil, tmp_path, capsys, tool):
    path, marker = evil
    argv = {
        "train-restore": ("train", targs(databin, str(tmp_path / "a"), "--restore-file", path)),
        "train-finetune": ("train", targs(databin, str(tmp_path / "b"), "--finetune-from-model", path)),
        "generate": ("generate", [databin, "--path", path, "--cpu", "--beam", "1", "--max-len-b", "5"]),
        "convert": ("convert", [path, str(tmp_path / "out.pt"), "--to", "seqtrain"]),
    }[tool]
    code, err = run_cli(cli(argv[0]), argv[1], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{path} needs arbitrary unpickling" in err and "pass --unsafe-load" in err
    assert "posix.mkdir" in err or "os.mkdir" in err
    assert not os.path.exists(marker)
    assert not os.path.exists(tmp_path / "out.pt") and not os.path.exists(
        tmp_path / "a" / "checkpoint_last.pt"
    )


def test_unsafe_load_is_the_only_way_and_says_so(databin, evil, tmp_path, capsys, caplog):
    path, marker = evil
    code, err = run_cli(
        cli("convert"), [path, str(tmp_path / "out.pt"), "--to", "seqtrain", "--unsafe-load"], capsys
    )
    assert code == 0 and os.path.isdir(marker)  # the payload did run: that is what the flag allows
    os.rmdir(marker)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        f"--unsafe-load: unpickling {path} without restrictions; code inside it can run" in w
        for w in warnings
    ), warnings
    converted = load_checkpoint_file(str(tmp_path / "out.pt"))  # the output is plain data again
    assert converted["format"] == "seqtrain"
