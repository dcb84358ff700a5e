"""The projected loss (output projection + label-smoothed NLL in chunks) at BART's vocabulary, V = 50,265, in
fp16 and bf16 autocast on the CPU, under an fp16 loss scale of 2^15, against full logits and
torch.nn.functional.cross_entropy(label_smoothing=0.1).

fairseq's smoothing puts eps / (V - 1) on every non-target symbol; torch's puts eps_t / V on every symbol, so
the two agree exactly when eps = eps_t * (V - 1) / V (the target then gets 1 - eps in both).

Tolerances (stated, checked below): against the same full-logits computation in the same precision (logits in
fp16/bf16, loss in fp32, the scaled logit gradient cast to fp16/bf16 by autograd) the loss agrees to 1e-6
relative and the gradients to within 1e-3 of their largest element (fp16; 1e-2 for bf16, whose 8-bit mantissa
makes single roundings differ); against fp64 the gradients agree to 2e-3 (fp16) / 2e-2 (bf16) of their largest
element, the precision of the low-precision products themselves.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from seqtrain.config import from_args
from seqtrain.criterions import DistillationConfig, LabelSmoothedCrossEntropyCriterion
from seqtrain.criterions.projected_loss import (
    CPU_BUDGET_BYTES,
    CUDA_BUDGET_BYTES,
    bytes_per_logit,
    chunk_budget_bytes,
    chunk_rows,
    projected_nll_loss,
)
from tests.utils import FP32

V = 50_265
SCALE = 2.0**15
EPS_T = 0.1
EPS = EPS_T * (V - 1) / V  # fairseq's epsilon equal to torch's label_smoothing=0.1


def _inputs(n=40, dim=32, seed=0, device="cpu"):
    """Hidden states of layer-norm size (|h| < 2: under a 2^15 scale the fp16 weight gradient of a target row,
    -0.9 * 2^15 * h, stays below fp16's 65,504, as in plain autograd)."""
    g = torch.Generator().manual_seed(seed)
    hidden = (0.5 * torch.randn(n, dim, generator=g)).clamp(-2, 2).requires_grad_()
    weight = (0.3 * torch.randn(V, dim, generator=g)).requires_grad_()
    target = torch.randint(0, V, (n,), generator=g)
    if device != "cpu":
        return (
            hidden.detach().to(device).requires_grad_(),
            weight.detach().to(device).requires_grad_(),
            target.to(device),
        )
    return hidden, weight, target


def _rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def _ours(hidden, weight, target, dtype, rows=None, grad_scale=SCALE):
    hidden.grad = weight.grad = None
    with torch.autocast(hidden.device.type, dtype=dtype):
        loss, _, _ = projected_nll_loss(hidden, weight, target, EPS, rows=rows, grad_scale=grad_scale)
    (loss * grad_scale).backward()
    return loss.detach(), hidden.grad / grad_scale, weight.grad / grad_scale


def _full_logits(hidden, weight, target, dtype):
    hidden.grad = weight.grad = None
    with torch.autocast(hidden.device.type, dtype=dtype):
        logits = F.linear(hidden, weight)
    assert logits.dtype == dtype
    loss = F.cross_entropy(logits.float(), target, label_smoothing=EPS_T, reduction="sum")
    (loss * SCALE).backward()
    return loss.detach(), hidden.grad / SCALE, weight.grad / SCALE


def _fp64(hidden, weight, target):
    h, w = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    loss = F.cross_entropy(F.linear(h, w), target, label_smoothing=EPS_T, reduction="sum")
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "dtype,tol_same,tol_fp64", [(torch.float16, 1e-3, 2e-3), (torch.bfloat16, 1e-2, 2e-2)]
)
def test_matches_full_logits_cross_entropy_at_bart_vocab_under_loss_scale(dtype, tol_same, tol_fp64, device):
    hidden, weight, target = _inputs(device=device)
    loss, gh, gw = _ours(hidden, weight, target, dtype)
    ref_loss, ref_gh, ref_gw = _full_logits(hidden, weight, target, dtype)
    assert loss.dtype == torch.float32
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert _rel(gh, ref_gh) < tol_same and _rel(gw, ref_gw) < tol_same
    exact_loss, exact_gh, exact_gw = _fp64(hidden, weight, target)
    assert float(loss) == pytest.approx(float(exact_loss), rel=2e-3)
    assert _rel(gh, exact_gh) < tol_fp64 and _rel(gw, exact_gw) < tol_fp64
    # chunks of 7 rows (weight gradient summed over 6 chunks in fp32) agree with one chunk to the precision of
    # the products (each chunk's product is rounded to fp16/bf16 once)
    _, gh7, gw7 = _ours(hidden, weight, target, dtype, rows=7)
    # (rows are independent: only the fp32 accumulation order of the products differs between chunkings)
    assert _rel(gh7, gh) < 1e-5 and _rel(gw7, gw) < tol_same
    assert _rel(gw7, exact_gw) < tol_fp64


def test_fp16_label_smoothing_gradient_is_not_subnormal():
    """A confident model: every non-target logit gradient is p_v - eps/(V-1) ~ -2e-6, subnormal in fp16 (the
    smallest normal fp16 is 6.1e-5), so an unscaled cast keeps only ~5 bits of it. The weight rows of symbols
    never targeted carry only that term. Scaled by 2^15 before the cast they come out to fp16 precision."""
    n, dim = 8, 16
    g = torch.Generator().manual_seed(1)
    h = F.normalize(torch.randn(n, dim, generator=g), dim=-1)
    target = torch.randperm(V, generator=g)[:n]
    w = torch.zeros(V, dim)
    w[target] = 20.0 * h  # target logit 20, the others 0: p_v ~ 2e-9
    hidden, weight = h.clone().requires_grad_(), w.clone().requires_grad_()
    untargeted = torch.ones(V, dtype=torch.bool)
    untargeted[target] = False
    _, _, exact_gw = _fp64(hidden, weight, target)
    exact = exact_gw[untargeted]
    assert exact.abs().max() < 2e-5  # the rows hold only the tiny smoothing term
    _, _, gw = _ours(hidden, weight, target, torch.float16)
    got = gw[untargeted]
    assert (got != 0).float().mean() == (exact != 0).float().mean()
    assert _rel(got, exact) < 1e-3
    # the test has teeth: without the scale the same gradient is off by more than 1% (fp16 subnormals)
    _, _, unscaled = _ours(hidden, weight, target, torch.float16, grad_scale=1.0)
    assert _rel(unscaled[untargeted], exact) > 1e-2


def test_weight_gradient_accumulates_in_fp32_for_a_low_precision_weight():
    """FSDP mixed precision hands the loss bf16 parameters (no autocast). 256 rows, one per chunk, all with
    the same target: that weight row's gradient is a sum of 256 terms of about -0.9 * h. Accumulated in fp32
    and rounded to bf16 once it is within bf16's rounding (2^-8 relative); summed in bf16 it would not be."""
    n, dim = 256, 16
    g = torch.Generator().manual_seed(2)
    h = (1.0 + 0.1 * torch.randn(n, dim, generator=g)).bfloat16().requires_grad_()
    w = (0.02 * torch.randn(V, dim, generator=g)).bfloat16().requires_grad_()
    target = torch.full((n,), 7)
    loss, _, _ = projected_nll_loss(h, w, target, EPS, rows=1)
    loss.backward()
    assert w.grad.dtype == torch.bfloat16 and h.grad.dtype == torch.bfloat16
    _, _, exact_gw = _fp64(h.detach().float(), w.detach().float(), target)
    assert _rel(w.grad[7], exact_gw[7]) < 2.0**-8
    # the test has teeth: the same per-chunk products summed in a bf16 accumulator are off by more than 1%
    with torch.no_grad():
        acc = torch.zeros(dim, dtype=torch.bfloat16)
        for i in range(n):
            p = F.linear(h[i : i + 1].float(), w.float()).softmax(-1) - EPS / (V - 1)
            acc += ((p[0, 7] - (1 - EPS - EPS / (V - 1))) * h[i].float()).bfloat16()
    assert _rel(acc, exact_gw[7]) > 1e-2


def test_chunk_rows_is_chosen_by_the_budget():
    assert bytes_per_logit(torch.float32) == 4
    assert bytes_per_logit(torch.float16) == bytes_per_logit(torch.bfloat16) == 8
    # all rows when their logits fit: 1,000 rows x 50,265 x 8 B = 402 MB < 512 MiB
    assert chunk_rows(1000, V, 512 << 20, 8) == 1000
    # else as many as fit, in multiples of 64: 512 MiB / (50,265 x 8 B) = 1,335 -> 1,280
    assert chunk_rows(16_384, V, 512 << 20, 8) == 1280
    assert chunk_rows(16_384, V, 40 * V * 8, 8) == 40  # below 64 rows: exact
    assert chunk_rows(10, V, 1, 8) == 1
    assert chunk_rows(0, V, 1 << 30, 8) == 1
    # the CPU's budget: 256 MiB, 667 bf16 rows -> 640, 1,335 fp32 rows -> 1,280
    assert chunk_budget_bytes(torch.device("cpu")) == CPU_BUDGET_BYTES == 256 << 20
    assert chunk_rows(16_384, V, CPU_BUDGET_BYTES, 8) == 640
    assert chunk_rows(16_384, V, CPU_BUDGET_BYTES, 4) == 1280
    # CUDA's: 1 GiB, 2,670 bf16 rows -> 2,624 (thousands of rows a chunk)
    assert chunk_budget_bytes(torch.device("cuda", 0)) == CUDA_BUDGET_BYTES == 1 << 30
    assert chunk_rows(16_384, V, CUDA_BUDGET_BYTES, 8) == 2624
    # --loss-chunk-mb replaces either
    assert (
        chunk_budget_bytes(torch.device("cpu"), 64)
        == chunk_budget_bytes(torch.device("cuda"), 64)
        == 64 << 20
    )
    assert chunk_rows(16_384, V, chunk_budget_bytes(torch.device("cpu"), 64), 4) == 320


class _Rows(TorchDispatchMode):
    """Counts the output projection's matrix products (one per chunk: N_chunk x C times C x V) and their rows."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.name in ("aten::mm", "aten::addmm") and out.dim() == 2 and out.size(-1) == V:
            self.rows.append(out.size(0))
        return out


def test_chunking_is_a_function_of_shapes_not_of_free_memory(monkeypatch):
    """No free-memory query decides the chunks (a resumed run, with other memory free, must chunk and sum as the
    unbroken one): the device's memory counters are never read, and whatever they would say, the chunk sizes
    follow from the row count, the vocabulary, the dtype and the budget alone."""

    def refuse(*_a, **_k):
        raise AssertionError("the loss asked how much memory is free")

    for name in ("mem_get_info", "memory_reserved", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    hidden, weight, target = _inputs(n=700)
    budget_mb = 100 * V * 4 / (1 << 20)  # 100 fp32 rows -> 64 a chunk
    seen = []
    for _ in range(2):
        with _Rows() as mode:
            projected_nll_loss(hidden.detach(), weight.detach(), target, EPS, budget_mb=budget_mb)
        seen.append(mode.rows)
    assert seen[0] == seen[1] == [64] * 10 + [60]
    with _Rows() as mode:  # bf16 rows take twice the bytes: half the rows a chunk (the first multiple of 64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            projected_nll_loss(hidden.detach(), weight.detach(), target, EPS, budget_mb=2 * budget_mb)
    assert mode.rows == [64] * 10 + [60]


def test_repeated_calls_are_bitwise_equal_in_several_chunks():
    """The same inputs give the same loss and gradients bit for bit, call after call, also when the rows are
    split into chunks (the weight gradient summed over 11 of them)."""
    hidden, weight, target = _inputs(n=700)
    budget_mb = 100 * V * 4 / (1 << 20)
    results = []
    for _ in range(3):
        hidden.grad = weight.grad = None
        loss, nll, _ = projected_nll_loss(hidden, weight, target, EPS, budget_mb=budget_mb)
        loss.backward()
        results.append((loss.detach(), nll, hidden.grad.clone(), weight.grad.clone()))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)
    # why it matters: all rows in one chunk sum the weight gradient in another order, and its bits differ
    hidden.grad = weight.grad = None
    projected_nll_loss(hidden, weight, target, EPS, rows=700)[0].backward()
    assert not torch.equal(weight.grad, results[0][3])
    assert _rel(weight.grad, results[0][3]) < 1e-5


class _TiedToy(nn.Module):
    """The model interface BART gives the criterion: features_only hidden states, decoder.output_projection
    (bias-free) and output_layer."""

    def __init__(self, vocab=37, dim=8):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, dim)
        self.decoder = nn.Module()
        self.decoder.output_projection = nn.Linear(dim, vocab, bias=False)

    def output_layer(self, x):
        return self.decoder.output_projection(x)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, features_only=False):
        x = torch.tanh(self.embed(prev_output_tokens) + self.embed(src_tokens).mean(1, keepdim=True))
        return (x if features_only else self.output_layer(x)), {}


class _SyncOps(TorchDispatchMode):
    """Records the operators that force a host-device sync on CUDA."""

    SYNCING = ("aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::item")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.SYNCING or (
            name.startswith("aten::index")
            and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for a in args
                if isinstance(a, (list, tuple))
                for i in a
            )
        ):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _toy_sample(with_rows):
    pad = 1
    target = torch.tensor([[5, 6, 7, 2], [8, 9, 2, pad], [4, 2, pad, pad]])
    prev = torch.tensor([[2, 5, 6, 7], [2, 8, 9, pad], [2, 4, pad, pad]])
    sample = {
        "nsentences": 3,
        "ntokens": 9,
        "target": target,
        "net_input": {
            "src_tokens": torch.tensor([[4, 5, 2], [7, 8, 2], [9, 9, 2]]),
            "src_lengths": torch.tensor([3, 3, 3]),
            "prev_output_tokens": prev,
        },
    }
    if with_rows:
        sample["target_rows"] = target.ne(pad).view(-1).nonzero().squeeze(1)  # as a collater makes it
    return sample


@pytest.mark.parametrize("with_rows", [True, False])
def test_criterion_forward_backward_forces_no_sync_and_target_rows_agree(with_rows):
    model = _TiedToy()
    crit = LabelSmoothedCrossEntropyCriterion(1, label_smoothing=0.1, report_accuracy=True)
    crit.loss_scale = SCALE
    sample = _toy_sample(with_rows)
    with _SyncOps() as mode:
        loss, size, log = crit(model, sample)
        (loss * SCALE).backward()
    assert mode.seen == []
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref_loss, _, ref_log = crit(model, _toy_sample(not with_rows))
    ref_loss.backward()
    assert size == 9 and int(log["total"]) == 9
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    assert int(log["n_correct"]) == int(ref_log["n_correct"])
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got / SCALE, p.grad, rtol=1e-5, atol=1e-7)


def test_loss_chunk_mb_reaches_the_projected_loss(monkeypatch):
    """--loss-chunk-mb (args.loss_chunk_mb) is the budget the criterion's projected loss chunks by."""
    import argparse

    import seqtrain.criterions.cross_entropy as ce

    budgets = []
    real = ce.projected_nll_loss

    def spy(*args, **kwargs):
        budgets.append(kwargs["budget_mb"])
        return real(*args, **kwargs)

    monkeypatch.setattr(ce, "projected_nll_loss", spy)
    for name in ("cross_entropy", "label_smoothed_cross_entropy"):
        args = argparse.Namespace(criterion=name, label_smoothing=0.1, loss_chunk_mb=8.0)
        crit = ce.CRITERIONS.get(name).from_config(from_args(DistillationConfig, args), 1)
        crit(_TiedToy(), _toy_sample(True))
    assert budgets == [8.0, 8.0]


class _ProductShapes(TorchDispatchMode):
    """Records the output shapes of the matrix products run under it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows", [None, 7])
def test_the_aligned_vocabulary_is_the_same_function(dtype, epsilon, rows):
    """The products against the weight padded to 8 (or 64) rows give the unpadded loss, nll, accuracy and
    gradients (the H200's odd-V kernels; here on the CPU, where the padding is only on when asked): fp64 to
    1e-12, fp32 to torch's fp32 tolerances, bf16 autocast to the bf16 tolerance of the test above; with a
    `valid` mask and in several chunks. And the padded products really ran: their outputs are 1,008 wide."""
    vocab, n, dim = 1_001, 40, 32
    g = torch.Generator().manual_seed(3)
    base = torch.float64 if dtype == torch.float64 else torch.float32
    hidden0 = (0.5 * torch.randn(n, dim, generator=g, dtype=base)).clamp(-2, 2)
    weight0 = 0.3 * torch.randn(vocab, dim, generator=g, dtype=base)
    target = torch.randint(0, vocab, (n,), generator=g)
    valid = torch.rand(n, generator=g) > 0.2
    results = {}
    for align in (1, 8, 64):
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        shapes = _ProductShapes()
        with shapes, torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss, nll, correct = projected_nll_loss(
                hidden, weight, target, epsilon, valid=valid, rows=rows, accuracy=True, align=align
            )
        loss.backward()
        widths = {s[-1] for s in shapes.shapes} | {s[0] for s in shapes.shapes}
        padded = vocab + (-vocab % align)
        assert (padded in widths) and (align == 1 or vocab not in widths), (align, widths)
        results[align] = (loss.detach(), nll, correct, hidden.grad, weight.grad)
    tol = {torch.float64: 1e-12, torch.float32: FP32["rtol"], torch.bfloat16: 1e-2}[dtype]
    ref = results[1]
    for align in (8, 64):
        loss, nll, correct, gh, gw = results[align]
        assert int(correct) == int(ref[2])
        assert float(loss) == pytest.approx(float(ref[0]), rel=tol, abs=1e-9)
        assert float(nll) == pytest.approx(float(ref[1]), rel=tol, abs=1e-9)
        assert gw.shape == ref[4].shape == (vocab, dim)
        assert _rel(gh, ref[3]) <= max(tol, 1e-12) * 10 and _rel(gw, ref[4]) <= max(tol, 1e-12) * 10


def test_the_aligned_vocabulary_chunks_at_its_padded_width():
    """The chunk budget counts the logits at the width they have: a budget of 40 fp32 rows at V = 50,265 holds
    39 rows at 50,272 (align 8), and the padded products (50,272 wide) run in chunks of 39."""
    hidden, weight, target = _inputs(n=100)
    budget_mb = 40 * V * 4 / (1 << 20)
    seen = {}
    for align in (1, 8):
        shapes = _ProductShapes()
        with shapes:
            projected_nll_loss(
                hidden.detach(), weight.detach(), target, EPS, budget_mb=budget_mb, align=align
            )
        width = V + (-V % align)
        seen[align] = [s[0] for s in shapes.shapes if s[-1] == width]
    assert seen == {1: [40, 40, 20], 8: [39, 39, 22]}


def test_the_padded_weight_is_cast_once_in_the_compute_dtype():
    """Under bf16 autocast the padded weight (seqtrain.cuda.padded_weight) is made once per call in bf16 (so
    neither F.linear nor the gradient products cast it again per chunk)."""
    hidden, weight, target = _inputs(n=30)
    casts = []

    class _Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            big = (
                torch.is_tensor(out) and out.dim() == 2 and out.size(0) >= V
            )  # a V x C weight, cast or padded
            if big and out.dtype == torch.bfloat16 and func.overloadpacket in allocations:
                casts.append(func.overloadpacket.__name__)
            return out

    ops = torch.ops.aten
    allocations = (ops.new_empty, ops.empty, ops.empty_strided, ops._to_copy, ops.constant_pad_nd, ops.clone)

    with _Casts(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = projected_nll_loss(hidden, weight, target, EPS, rows=7, align=8)[0]
    loss.backward()
    assert casts == ["new_empty"], casts
