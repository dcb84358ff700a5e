"""--bf16 --bf16-mode fairseq (seqtrain.train.precision): a bf16 copy of the model computes, the fp32 model is the
master the optimizer steps. The update equals a hand-written reference bit for bit (bf16 forward/backward, the
bf16 gradients upcast, normalised, clipped and stepped by AdamW on fp32 masters, the copy rounded from them);
the first loss is within bf16 rounding of fp32's; training lowers the loss; frozen weights, EMA validation and
bad flag combinations behave."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.flags import parsing, training
from seqtrain.tasks import setup_task
from seqtrain.train import loop as train_loop
from seqtrain.train.program import train_config
from seqtrain.train.trainer import Trainer

SEED = 5


def build_trainer(data: str, save_dir: str, *extra: str, init: dict | None = None) -> Trainer:
    argv = [
        data,
        "--arch",
        "bart_tiny",
        "--cpu",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--lr",
        "3e-3",
        "--weight-decay",
        "0.01",
        "--max-tokens",
        "512",
        "--seed",
        str(SEED),
        "--save-dir",
        save_dir,
        "--log-format",
        "none",
        *extra,
    ]
    cfg = train_config(parsing.parse_args_and_arch(training.get_training_parser(), argv))
    task = setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    if init is not None:
        model.load_state_dict(init)
    return train_loop.build_trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def batches(trainer: Trainer, n: int, size: int = 16) -> list:
    dataset = trainer.task.dataset("train")
    return [dataset.collater([dataset[i] for i in range(k * size, (k + 1) * size)]) for k in range(n)]


FAIRSEQ = ("--bf16", "--bf16-mode", "fairseq")


def test_update_equals_hand_written_reference(databin, tmp_path):
    """Two updates of two batches each (--update-freq 2), clipped (--clip-norm 0.3 binds), dropout on."""
    trainer = build_trainer(databin, str(tmp_path), *FAIRSEQ, "--clip-norm", "0.3", "--update-freq", "2")
    assert trainer.amp_dtype is None and trainer.compute_model is not trainer.model
    assert trainer.optimizer.optimizer.defaults["fused"]  # the project's fused AdamW steps the masters
    master = copy.deepcopy(trainer.model)  # the reference, from the same fp32 start
    start = {k: v.clone() for k, v in master.state_dict().items()}
    compute = copy.deepcopy(master).to(torch.bfloat16)
    criterion = trainer.criterion
    trained = [(n, p) for n, p in master.named_parameters() if p.requires_grad]
    copies = dict(compute.named_parameters())
    opt = torch.optim.AdamW(
        [p for _, p in trained], lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True
    )
    data = batches(trainer, 4)
    for update in range(2):
        samples = data[2 * update : 2 * update + 2]
        stats = trainer.train_step(samples)
        assert stats is not None
        # the reference update
        torch.manual_seed(SEED + update)
        compute.train()
        size = 0
        for sample in samples:
            loss, n, _ = criterion(compute, sample)
            loss.backward()
            size += n
        grads = []
        for name, p in trained:
            g16 = copies[name].grad
            assert g16.dtype == torch.bfloat16
            p.grad = g16.float() * (1.0 / size)
            copies[name].grad = None
            grads.append(p.grad)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        coef = (0.3 / (norm + 1e-6)).clamp(max=1.0)
        assert coef < 1.0  # the clip binds
        torch._foreach_mul_(grads, coef)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for name, p in trained:
                copies[name].copy_(p)
        assert stats["gnorm"] == pytest.approx(float(norm), rel=1e-6)
    for k, v in master.state_dict().items():
        got = trainer.model.state_dict()[k]
        assert got.dtype == torch.float32 and torch.equal(got, v), k
    for k, v in compute.state_dict().items():
        got = trainer.compute_model.state_dict()[k]
        assert got.dtype == v.dtype and torch.equal(got, v), k
    # the masters moved by less than bf16 can hold: they are not the bf16 copy's values
    w = trainer.model.state_dict()["encoder.layers.0.fc1.weight"]
    assert not torch.equal(w, start["encoder.layers.0.fc1.weight"])
    assert not torch.equal(w, w.to(torch.bfloat16).float())
    state = trainer.optimizer.state_dict()["state"]
    assert all(v.dtype == torch.float32 for s in state.values() for k, v in s.items() if k != "step")


def test_first_loss_within_bf16_rounding_of_fp32(databin, tmp_path):
    ref = build_trainer(databin, str(tmp_path / "fp32"), "--dropout", "0")
    init = ref.model.state_dict()
    low = build_trainer(databin, str(tmp_path / "bf16"), "--dropout", "0", *FAIRSEQ, init=init)
    sample = batches(ref, 1, size=32)
    a = ref.train_step(sample)["loss"]
    b = low.train_step(sample)["loss"]
    # bf16 keeps 8 significant bits (relative rounding 2**-9); the loss sums thousands of such products
    assert a != b and abs(a - b) / a < 2**-8, (a, b)


def test_training_lowers_the_loss(databin, tmp_path):
    trainer = build_trainer(databin, str(tmp_path), *FAIRSEQ)
    data = batches(trainer, 4)
    losses = [trainer.train_step([data[i % 4]])["loss"] for i in range(12)]
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 0.3, losses
    assert all(math.isfinite(x) for x in losses)


def test_frozen_weights_keep_fp32_and_the_copy_follows(databin, tmp_path):
    trainer = build_trainer(databin, str(tmp_path), *FAIRSEQ, "--freeze-encoder")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    data = batches(trainer, 2)
    for sample in data:
        trainer.train_step([sample])
    after = trainer.model.state_dict()
    frozen = [k for k in before if k.startswith("encoder.layers.")]
    assert frozen and all(torch.equal(after[k], before[k]) for k in frozen)  # fp32, never rounded
    assert not torch.equal(after["decoder.layers.0.fc1.weight"], before["decoder.layers.0.fc1.weight"])
    for k, v in trainer.compute_model.state_dict().items():
        expect = after[k].to(torch.bfloat16) if after[k].is_floating_point() else after[k]
        assert torch.equal(v, expect), k


def test_validation_with_ema_rounds_the_ema_in_and_back_out(databin, tmp_path):
    trainer = build_trainer(
        databin, str(tmp_path), *FAIRSEQ, "--store-ema", "--ema-decay", "0.5", "--validate-with-ema"
    )
    for sample in batches(trainer, 2):
        trainer.train_step([sample])
    master = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    key = "decoder.layers.0.fc1.weight"
    assert not torch.equal(trainer.ema.shadow[key], master[key])
    with trainer.validation_weights():
        assert torch.equal(
            trainer.compute_model.state_dict()[key], trainer.ema.shadow[key].to(torch.bfloat16)
        )
    assert torch.equal(trainer.compute_model.state_dict()[key], master[key].to(torch.bfloat16))
    assert all(torch.equal(v, master[k]) for k, v in trainer.model.state_dict().items())


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--bf16-mode", "fairseq"), "--bf16-mode fairseq needs --bf16"),
        (
            ("--memory-efficient-bf16", "--bf16-mode", "fairseq"),
            "--memory-efficient-bf16 .* cannot be combined with --bf16-mode fairseq",
        ),
        (
            (*FAIRSEQ, "--ddp-backend", "fully_sharded"),
            "--bf16-mode fairseq cannot be used with --ddp-backend fully_sharded",
        ),
    ],
    ids=["without-bf16", "memory-efficient", "fsdp"],
)
def test_bad_combinations_are_one_line(databin, tmp_path, flags, message):
    with pytest.raises(SeqtrainError, match=message) as e:
        build_trainer(databin, str(tmp_path), *flags)
    assert "\n" not in str(e.value)


def test_lora_trains_fp32_adapters_over_a_bf16_base(databin, tmp_path):
    trainer = build_trainer(
        databin, str(tmp_path), *FAIRSEQ, "--lora-rank", "4", "--lora-modules", "q_proj,fc1"
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for sample in batches(trainer, 3):
        trainer.train_step([sample])
    after = trainer.model.state_dict()
    adapters = [k for k in after if k.endswith((".lora_A", ".lora_B"))]
    assert adapters and all(after[k].dtype == torch.float32 for k in adapters)
    assert all(torch.equal(after[k], before[k]) for k in before if k not in adapters)  # the base never moves
    assert any(after[k].abs().sum() > 0 for k in adapters if k.endswith("lora_B"))  # B started at zero
    assert trainer.compute_model.state_dict()[adapters[0]].dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------ fp16's fold
def _scaled_run(data, tmp, n, fold, monkeypatch, start=None, stop=None, inject_at=2):
    """n updates of a CPU fp32 trainer given fp16's dynamic loss scaler (fp16 autocast needs CUDA; the loss is
    scaled and the trainer unscales as under --fp16; fp32, not bf16 autocast, so that a 1-ulp difference in a
    weight does not flip a bf16 rounding in the next forward pass): the unscale folded into fused AdamW or not.
    An inf in one gradient at update `inject_at` must be skipped. `start`: a state dict to resume from; returns the
    trainer and its state after `stop` updates (if given)."""
    from seqtrain.optim import DynamicLossScaler, Optimizer

    with monkeypatch.context() as m:
        if not fold:
            m.setattr(Optimizer, "folds_grad_scale", property(lambda self: False))
        trainer = build_trainer(data, str(tmp), "--clip-norm", "0.5")
        trainer.scaler = DynamicLossScaler(init_scale=2.0**10, scale_window=2)
        if start is not None:
            trainer.load_state_dict(start, "state")
        real = trainer.task.train_step

        def step(sample, model, *args, **kwargs):
            out = real(sample, model, *args, **kwargs)
            if trainer.num_updates == inject_at and not getattr(trainer, "_injected", False):
                trainer._injected = True
                next(p for p in trainer.model.parameters() if p.grad is not None).grad.view(-1)[0] = float(
                    "inf"
                )
            return out

        trainer.task.train_step = step
        data_ = batches(trainer, 4)
        saved, skipped = None, []
        while trainer.num_updates < n:
            if trainer.num_updates == stop and saved is None:
                saved = copy.deepcopy(trainer.state_dict())  # (its tensors are the live ones)
            before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
            if trainer.train_step([data_[trainer.num_updates % 4]]) is None:
                skipped.append(trainer.num_updates)
                assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
        return trainer, saved, skipped


def test_fp16_unscale_folded_into_fused_adamw_equals_the_pass(databin, tmp_path, monkeypatch):
    folded, saved, skipped = _scaled_run(databin, tmp_path / "a", 6, True, monkeypatch, stop=4)
    plain, _, skipped_plain = _scaled_run(databin, tmp_path / "b", 6, False, monkeypatch)
    assert skipped == skipped_plain == [2]  # the overflow skipped update 3 on both paths
    assert folded.scaler.state_dict() == plain.scaler.state_dict()
    assert folded.scaler.loss_scale != 2.0**10  # halved once, doubled by the window
    a, b = folded.model.state_dict(), plain.model.state_dict()
    # a few ulps of weights below 1 after 5 steps (tests/unit/optim/test_grad_scale_fold.py's bound); the
    # key projections' biases have zero gradient in exact arithmetic (softmax ignores them) and Adam turns
    # their rounding noise into +-lr steps, which the 1-ulp differences elsewhere reshuffle: 1e-5 for them
    diff = max(float((a[k] - b[k]).abs().max()) for k in a if not k.endswith("k_proj.bias"))
    assert diff <= 5 * 2.0**-23, diff
    assert max(float((a[k] - b[k]).abs().max()) for k in a if k.endswith("k_proj.bias")) <= 1e-5
    # resume from update 4 of the folded run: bitwise the unbroken one
    resumed, _, _ = _scaled_run(databin, tmp_path / "c", 6, True, monkeypatch, start=saved, inject_at=-1)
    c = resumed.model.state_dict()
    assert all(torch.equal(a[k], c[k]) for k in a)
    sa, sc = folded.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sc[i][k]) for i in sa for k in sa[i])
    assert resumed.scaler.state_dict() == folded.scaler.state_dict()
