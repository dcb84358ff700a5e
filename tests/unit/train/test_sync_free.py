"""Host-device synchronisations of a training update and of a decoding step.

On CUDA every read of a device value by the host (item/float/bool, tolist, a copy to the CPU) and every
operation whose output size depends on the data (nonzero, masked_select, boolean-mask indexing) makes the host
wait for the device's queued work. On the CPU nothing waits, so SyncCounter counts the operations that WOULD wait,
taking the model's device for "the device": `aten._local_scalar_dense` (item/float/bool/int), nonzero,
masked_select, argwhere, unique, repeat_interleave without an output size, indexing or index_put with a
boolean mask, torch.equal, and the Python-level reads tolist/numpy/cpu. Each sync is recorded with the
seqtrain source line that caused it, so a failure says where.

Budgets: forward + backward of a training batch: 0 (the collater's packed path); a whole update: 1 (the gradient
norm and the logged figures in one transfer); a decoding step of beam search: at most 1. On CUDA the forward and
backward run under torch.cuda.set_sync_debug_mode("error"), and the update's syncs are counted from its
warnings.
"""

from __future__ import annotations

import inspect
import os
import random
import traceback
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seqtrain.flags import parsing, training
from seqtrain.generation.sequence_generator import SequenceGenerator
from seqtrain.tasks import setup_task
from seqtrain.train import loop as train_loop
from seqtrain.train.program import TrainConfig, train_config
from seqtrain.train.trainer import Trainer
from seqtrain_cli.preprocess import preprocess_main
from tests.utils import FP32

SEQTRAIN = os.path.dirname(os.path.dirname(inspect.getfile(Trainer)))  # the seqtrain package
DATA_DEPENDENT = {
    "nonzero",
    "masked_select",
    "argwhere",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "equal",
}


def _caller() -> str:
    """The innermost seqtrain source line on the stack (outside the torch and test frames)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(SEQTRAIN):
            return f"{os.path.relpath(frame.filename, SEQTRAIN)}:{frame.lineno} {frame.line}"
    return "<outside seqtrain>"


class SyncCounter(TorchDispatchMode):
    """Records every operation that forces a host-device sync on CUDA; `syncs` lists (op, seqtrain line)."""

    def __init__(self, host: tuple[torch.Tensor, ...] = ()) -> None:
        """`host`: tensors that stay on the host by contract (the layout's `*_host` bounds): reading them
        makes no sync on any device."""
        super().__init__()
        self.host = {id(t) for t in host}
        self.syncs: list[tuple[str, str]] = []
        self._patched: list[tuple[str, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense" or name in DATA_DEPENDENT:
            self.syncs.append((name, _caller()))
        elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) == 1:
            self.syncs.append((name, _caller()))
        elif name in ("index", "index_put", "index_put_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(t is not None and t.dtype == torch.bool for t in indices):
                self.syncs.append((f"{name}[bool mask]", _caller()))
        return func(*args, **kwargs)

    def __enter__(self):
        for method in ("tolist", "numpy", "cpu"):
            real = getattr(torch.Tensor, method)

            def reading(t, *a, _real=real, _name=method, **kw):
                if id(t) not in self.host:
                    self.syncs.append((_name, _caller()))
                return _real(t, *a, **kw)

            self._patched.append((method, real))
            setattr(torch.Tensor, method, reading)
        return super().__enter__()

    def __exit__(self, *exc):
        for method, real in self._patched:
            setattr(torch.Tensor, method, real)
        self._patched.clear()
        return super().__exit__(*exc)


def build_trainer(data: str, save_dir: str, *extra: str) -> Trainer:
    return build(data, save_dir, *extra)[1]


def build(data: str, save_dir: str, *extra: str) -> tuple[TrainConfig, Trainer]:
    """The settings of a bart_tiny run on `data` and its Trainer (the train split loaded)."""
    argv = [
        data,
        "--arch",
        "bart_tiny",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--lr",
        "1e-3",
        "--max-tokens",
        "512",
        "--save-dir",
        save_dir,
        "--log-format",
        "none",
        *extra,
    ]
    cfg = train_config(parsing.parse_args_and_arch(training.get_training_parser(), argv))
    task = setup_task(cfg.task)
    task.load_dataset("train")
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    return cfg, train_loop.build_trainer(cfg, task, model, criterion)


@pytest.fixture(scope="module")
def databin(tmp_path_factory) -> str:
    """64 pairs with pads on both sides of a batch: sources of 3-12 words, targets of 1-8."""
    folder = tmp_path_factory.mktemp("sync_data")
    r = random.Random(0)
    with open(folder / "train.src", "w") as fs, open(folder / "train.tgt", "w") as ft:
        for _ in range(64):
            words = [f"w{r.randrange(20)}" for _ in range(r.randint(3, 12))]
            fs.write(" ".join(words) + "\n")
            ft.write(" ".join(words[: r.randint(1, 8)]) + "\n")
    dest = str(folder / "bin")
    preprocess_main(
        [
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            "--trainpref",
            str(folder / "train"),
            "--destdir",
            dest,
        ]
        + ["--joined-dictionary", "--tokenizer", "none", "--no-progress-bar"]
    )
    return dest


@pytest.fixture(scope="module")
def trainer(databin, tmp_path_factory):
    return build_trainer(databin, str(tmp_path_factory.mktemp("sync")), "--cpu")


def batches(trainer: Trainer, packed: bool, n: int = 2, size: int = 8) -> list:
    """`n` collated training batches: as the collater makes them (`packed`: the model runs packed), or without
    their layout (the model runs padded, finding the pads on the device)."""
    dataset = trainer.task.dataset("train")
    out = [dataset.collater([dataset[i] for i in range(k * size, (k + 1) * size)]) for k in range(n)]
    for b in out:
        net = b["net_input"]
        assert net["src_tokens"].eq(1).any() and net["prev_output_tokens"].eq(1).any()  # pads on both sides
        if not packed:
            del net["layout"]
    return out


def host_bounds(sample: dict) -> tuple[torch.Tensor, ...]:
    """The layout's host-side tensors, which prepare_sample leaves on the CPU (checked)."""
    layout = sample["net_input"]["layout"]
    host = tuple(v for k, v in layout.items() if k.endswith("_host"))
    assert len(host) == 2 and all(t.device.type == "cpu" for t in host)
    return host


def forward_backward(trainer: Trainer, sample: dict) -> torch.Tensor:
    trainer.model.train()
    loss, _, _ = trainer.criterion(trainer.model, trainer.prepare_sample(sample))
    loss.backward()
    return loss


def test_forward_and_backward_do_not_sync(trainer):
    sample = trainer.prepare_sample(batches(trainer, True, n=1)[0])
    trainer.optimizer.zero_grad()
    with SyncCounter(host_bounds(sample)) as counter:
        forward_backward(trainer, sample)
    assert counter.syncs == [], counter.syncs
    assert not [s for s in counter.syncs if s[1].startswith("models/")], counter.syncs


def test_the_criterion_does_not_sync(trainer):
    sample = trainer.prepare_sample(batches(trainer, True, n=1)[0])
    trainer.optimizer.zero_grad()
    with SyncCounter(host_bounds(sample)) as counter:
        forward_backward(trainer, sample)
    assert counter.syncs == []


def test_without_the_collater_layout_the_model_finds_pads_on_the_device(trainer):
    """A caller's own batch (no layout) still works; it pays the syncs the layout spares."""
    net_input = dict(batches(trainer, True, n=1)[0]["net_input"])
    del net_input["layout"]
    trainer.model.eval()
    with torch.no_grad(), SyncCounter() as counter:
        trainer.model(**net_input)
    ops = [op for op, _ in counter.syncs]
    # the attention masks of encoder and decoder (.any()); nothing is packed
    assert ops.count("_local_scalar_dense") == 2 and len(ops) == 2, counter.syncs


def test_an_update_syncs_once(trainer):
    samples = batches(trainer, True, n=2)
    with SyncCounter(sum((host_bounds(s) for s in samples), ())) as counter:
        stats = trainer.train_step(samples)
    assert stats is not None and stats["ntokens"] == sum(s["ntokens"] for s in samples)
    assert len(counter.syncs) == 1, counter.syncs
    assert counter.syncs[0][0] == "tolist" and counter.syncs[0][1].startswith("train/trainer.py")


def test_packed_and_padded_paths_agree(trainer):
    """The collater's layout changes where work runs, never the result: logits, loss and gradients."""
    results = []
    for packed in (False, True):
        sample = trainer.prepare_sample(batches(trainer, packed, n=1)[0])
        trainer.model.eval()  # no dropout
        trainer.optimizer.zero_grad()
        out, extra = trainer.model(**sample["net_input"])
        rows = sample["target_rows"]
        if not packed:  # the padded output's real target rows, as the packed one holds them
            out = out.reshape(-1, out.size(-1)).index_select(0, rows)
        assert extra.get("packed", False) == packed
        target = sample["target"].reshape(-1).index_select(0, rows)
        loss = torch.nn.functional.cross_entropy(out, target, reduction="sum")
        loss.backward()
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        results.append((out.detach(), loss.detach(), grads))
    (out_a, loss_a, grads_a), (out_b, loss_b, grads_b) = results
    torch.testing.assert_close(out_a, out_b, **FP32)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=0)
    for a, b in zip(grads_a, grads_b):  # (fp32 sums in another order: a few ulps of the larger elements)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_beam_search_syncs_at_most_once_per_step(trainer):
    dataset = trainer.task.dataset("train")
    sample = dataset.collater([dataset[i] for i in range(6)])
    # the eager loop, the one CUDA runs (the compiled CPU step, cpu_step.py, never calls the model's decoder and
    # reads its tensors in C++: there is no device to wait for on the CPU)
    generator = SequenceGenerator(
        trainer.model, trainer.task.tgt_dict, beam_size=3, max_len_b=12, cpu_step=False
    )
    steps = []
    real_forward = trainer.model.decoder.forward

    def counting_forward(*a, **kw):
        steps.append(1)
        return real_forward(*a, **kw)

    trainer.model.decoder.forward = counting_forward
    try:
        with torch.no_grad(), SyncCounter() as counter:
            hypos = generator.generate(sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"])
    finally:
        del trainer.model.decoder.forward
    assert len(hypos) == 6 and all(len(h) == 3 for h in hypos)
    # per step at most one; per batch two more (the encoder's attention mask, the max lengths)
    in_loop = [s for s in counter.syncs if s[1].startswith("generation/")]
    # one per step (which candidates end), one at the end (all finished hypotheses in one transfer), one for
    # the max lengths
    assert len(in_loop) <= len(steps) + 2, (len(steps), counter.syncs)
    # and per batch, as a forward pass without the collater's layout: the encoder's mask (or, packed, its row
    # lengths), the decoder's cross-attention mask (once, kept in the incremental state). On the CPU the
    # encoder's default choice between packed and padded counts the pads too (BartEncoder.packs_by_default:
    # host memory there; on CUDA it reads nothing), which is no sync on any device.
    per_batch = [s for s in counter.syncs if s not in in_loop and "int(padding_mask.sum())" not in s[1]]
    assert len(per_batch) <= 2, counter.syncs


@pytest.mark.cuda
def test_cuda_forward_backward_raise_on_sync_and_an_update_syncs_once(databin, tmp_path):
    trainer = build_trainer(databin, str(tmp_path))
    assert trainer.device.type == "cuda"
    for packed in (True,):  # (the padded path finds its pads on the device: syncs by design)
        samples = batches(trainer, packed, n=2)
        forward_backward(trainer, samples[0])  # warm-up: allocator, kernels
        trainer.optimizer.zero_grad()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            forward_backward(trainer, samples[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        trainer.optimizer.zero_grad()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert trainer.train_step(samples) is not None
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        assert len(syncs) <= 2, [str(w.message) for w in syncs]


@pytest.mark.cuda
@pytest.mark.parametrize("flag", [(), ("--no-tf32",)], ids=["default", "no-tf32"])
def test_cuda_fp32_matmuls_use_tf32_unless_no_tf32(databin, tmp_path, flag):
    build_trainer(databin, str(tmp_path), *flag)
    assert torch.backends.cuda.matmul.allow_tf32 is (not flag)
    assert torch.backends.cudnn.allow_tf32 is (not flag)


@pytest.mark.cuda
@pytest.mark.parametrize("flag", [(), ("--cudnn-attention",)], ids=["default", "cudnn-attention"])
def test_cuda_attention_stays_off_cudnn_unless_asked(databin, tmp_path, flag):
    """cuDNN's attention builds a plan for every new batch shape (seqtrain.cuda): off unless asked for."""
    torch.backends.cuda.enable_cudnn_sdp(True)  # torch's default
    build_trainer(databin, str(tmp_path), *flag)
    assert torch.backends.cuda.cudnn_sdp_enabled() is bool(flag)
