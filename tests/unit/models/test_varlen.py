"""seqtrain.models.varlen: the reference against padded SDPA, the custom op's opcheck and fake implementation,
the adapters of both varlen_attn signatures (tested with stand-ins), and the dispatcher's choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqtrain.models import varlen
from seqtrain.models.varlen import (
    adapt_varlen_attn,
    kernel_serves,
    reference_attention,
    varlen_attention,
    varlen_attention_op,
)
from tests.utils import FP32

LENGTHS_Q, LENGTHS_K = [5, 1, 3, 7], [4, 6, 1, 7]


def cu_of(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def packed(lengths: list[int], dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), 2, 8, generator=g, dtype=dtype)


def padded_reference(q, k, v, lq, lk, causal):
    """The same attention through one padded, masked SDPA call (the padded path's way)."""
    b, tq, tk = len(lq), max(lq), max(lk)
    pq = q.new_zeros(b, tq, *q.shape[1:])
    pk, pv = k.new_zeros(b, tk, *k.shape[1:]), v.new_zeros(b, tk, *v.shape[1:])
    cq, ck = cu_of(lq).tolist(), cu_of(lk).tolist()
    for i in range(b):
        pq[i, : lq[i]] = q[cq[i] : cq[i + 1]]
        pk[i, : lk[i]], pv[i, : lk[i]] = k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]]
    mask = torch.arange(tk)[None, None, None, :] < torch.tensor(lk)[:, None, None, None]
    if causal:
        mask = mask & torch.ones(tq, tk, dtype=torch.bool).tril()
    o = F.scaled_dot_product_attention(
        pq.transpose(1, 2), pk.transpose(1, 2), pv.transpose(1, 2), attn_mask=mask
    )
    o = o.transpose(1, 2)
    return torch.cat([o[i, : lq[i]] for i in range(b)])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_op_equals_padded_masked_sdpa_with_gradients(causal):
    lq = LENGTHS_Q
    lk = LENGTHS_Q if causal else LENGTHS_K  # causal: self-attention
    q, k, v = (packed(n, seed=s).requires_grad_() for n, s in ((lq, 0), (lk, 1), (lk, 2)))
    out = varlen_attention(q, k, v, cu_of(lq), cu_of(lk), 64, 64, causal)
    grad = packed(lq, seed=3)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref = padded_reference(q, k, v, lq, lk, causal)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_operator_and_the_eager_cpu_path_agree_with_gradients(causal):
    """varlen_attention eagerly on the CPU runs varlen.padded_reference (one masked SDPA); torch.compile traces
    the operator (a loop over segments with a hand-written backward): the two agree to 1e-12 in fp64, also with
    an empty segment."""
    lq = [*LENGTHS_Q, 0]
    lk = lq if causal else [*LENGTHS_K, 3]
    q, k, v = (packed(n, seed=s).requires_grad_() for n, s in ((lq, 0), (lk, 1), (lk, 2)))
    grad = packed(lq, seed=3)
    eager = varlen_attention(q, k, v, cu_of(lq), cu_of(lk), 64, 64, causal)
    op = varlen_attention_op(q, k, v, cu_of(lq), cu_of(lk), 64, 64, causal)
    torch.testing.assert_close(eager, op, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(eager, (q, k, v), grad), torch.autograd.grad(op, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


RUN_LENGTHS = {  # (query lengths, key lengths): keys in runs of equal length, as length-bucketed batches have
    "self": ([6, 6, 6, 5, 5, 2], None),
    "one run": ([7, 7, 7], None),
    "cross": ([3, 5, 2, 4, 4, 1], [6, 6, 6, 5, 5, 9]),
    "cross, an empty query": ([3, 0, 2, 4], [6, 6, 5, 5]),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(RUN_LENGTHS))
def test_the_eager_cpu_path_by_runs_of_equal_key_lengths_agrees_with_the_operator(case, causal):
    """Keys in at most varlen.MAX_RUNS runs of equal length attend run by run (views of the packed rows, no
    mask; queries of unequal length zero-padded within their run): the same as the operator to 1e-12 in fp64,
    gradients too."""
    lq, lk = RUN_LENGTHS[case]
    if lk is None:
        lk = lq
    elif causal:
        pytest.skip("causal attention is self-attention")
    assert len(varlen._runs(lk)) <= varlen.MAX_RUNS
    plan = varlen._Plan(cu_of(lq).tolist(), cu_of(lk).tolist(), causal)
    assert plan.groups is not None
    q, k, v = (packed(n, seed=s).requires_grad_() for n, s in ((lq, 0), (lk, 1), (lk, 2)))
    grad = packed(lq, seed=3)
    eager = varlen_attention(q, k, v, cu_of(lq), cu_of(lk), 64, 64, causal)
    op = varlen_attention_op(q, k, v, cu_of(lq), cu_of(lk), 64, 64, causal)
    torch.testing.assert_close(eager, op, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(eager, (q, k, v), grad), torch.autograd.grad(op, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_many_key_lengths_are_laid_out_padded_and_causal_needs_no_mask():
    lengths = [5, 1, 3, 7, 2, 6]
    assert len(varlen._runs(lengths)) > varlen.MAX_RUNS
    full = varlen._Plan(cu_of(lengths).tolist(), cu_of(lengths).tolist(), False)
    causal = varlen._Plan(cu_of(lengths).tolist(), cu_of(lengths).tolist(), True)
    assert full.groups is None and causal.groups is None
    assert full.mask is not None and causal.mask is None
    assert (full.tq, full.tk) == (7, 7)
    assert full.rows_q.tolist()[:7] == [0, 1, 2, 3, 4, 7, 14]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_and_the_fake_implementation(causal):
    q, k, v = (packed(LENGTHS_Q, torch.float32, s).requires_grad_() for s in range(3))
    cu = cu_of(LENGTHS_Q)
    torch.library.opcheck(varlen_attention_op, (q, k, v, cu, cu, 64, 64, causal))
    with torch._subclasses.FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out = varlen_attention_op(fq, fk, fv, mode.from_tensor(cu), mode.from_tensor(cu), 64, 64, causal)
    assert out.shape == q.shape and out.dtype == q.dtype


def test_dropout_draws_per_segment_and_keeps_the_expectation():
    """Attention dropout > 0 takes the reference under plain autograd: masks differ per call, each row's
    expectation is the dropout-free output."""
    q, k, v = (packed(LENGTHS_Q, seed=s) for s in range(3))
    cu = cu_of(LENGTHS_Q)
    torch.manual_seed(0)
    draws = torch.stack(
        [varlen_attention(q, k, v, cu, cu, 64, 64, False, dropout_p=0.5) for _ in range(2000)]
    )
    exact = reference_attention(q, k, v, cu, cu, False)
    assert not torch.equal(draws[0], draws[1])
    torch.testing.assert_close(draws.mean(0), exact, rtol=0, atol=0.1)


def _stand_in_is_causal(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, is_causal=False):
    _stand_in_is_causal.seen = (max_q, max_k, is_causal)
    return reference_attention(q, k, v, cu_seq_q, cu_seq_k, is_causal)


def _stand_in_window(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, window_size=(-1, -1)):
    _stand_in_window.seen = (max_q, max_k, window_size)
    return reference_attention(q, k, v, cu_seq_q, cu_seq_k, tuple(window_size) == (-1, 0))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_adapters_of_both_signatures_pass_causality_as_each_expects(causal):
    q, k, v = (packed(LENGTHS_Q, seed=s) for s in range(3))
    cu = cu_of(LENGTHS_Q)
    want = reference_attention(q, k, v, cu, cu, causal)
    for fn, seen in (
        (_stand_in_is_causal, (64, 128, causal)),
        (_stand_in_window, (64, 128, (-1, 0) if causal else (-1, -1))),
    ):
        kernel = adapt_varlen_attn(fn)
        assert kernel is not None
        torch.testing.assert_close(kernel(q, k, v, cu, cu, 64, 128, causal), want, rtol=0, atol=0)
        assert fn.seen == seen
    assert adapt_varlen_attn(lambda q, k, v, cu_q, cu_k, max_q, max_k: q) is None  # no causal switch known


def test_this_torch_varlen_attn_is_adapted():
    """The installed torch's varlen_attn (when it has one) has a signature the adapter knows."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    assert adapt_varlen_attn(varlen_attn) is not None and varlen.varlen_kernel() is not None


def test_the_kernel_serves_only_cuda_half_precision_without_dropout():
    cpu = torch.zeros(3, 2, 64, dtype=torch.bfloat16)
    assert not kernel_serves(cpu, 0.0)  # the CPU: the reference
    if torch.cuda.is_available() and varlen.varlen_kernel() is not None:
        cuda = cpu.cuda()
        assert (
            kernel_serves(cuda, 0.0) and not kernel_serves(cuda, 0.1) and not kernel_serves(cuda.float(), 0.0)
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_kernel_matches_the_fp32_reference(causal):
    if varlen.varlen_kernel() is None:
        pytest.skip("this torch has no varlen_attn")
    q, k, v = (packed(LENGTHS_Q, torch.float32, s).cuda().requires_grad_() for s in range(3))
    cu = cu_of(LENGTHS_Q).cuda()
    ref = varlen_attention(q, k, v, cu, cu, 64, 64, causal)  # fp32: the reference
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out = varlen_attention(*low, cu, cu, 64, 64, causal)  # bf16: the kernel, max lengths rounded up
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(out.float().sum(), low)
    want = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a.float(), b, rtol=5e-2, atol=5e-2)


def _stand_in_kernel(monkeypatch):
    """A varlen kernel as this torch would offer it on CUDA (the probe mocked: the choice is tested on the CPU)."""
    monkeypatch.setattr(varlen, "varlen_kernel", lambda: lambda *a: None)
    monkeypatch.setattr(varlen, "_ROUTED", [])


def test_deterministic_mode_keeps_the_kernel_when_its_backward_is_deterministic(monkeypatch):
    """Under --deterministic (cuDNN attention off, as the Trainer keeps it) the CUDA case takes torch's varlen
    kernel: FA2's backward runs its deterministic dQ accumulation in this mode."""
    _stand_in_kernel(monkeypatch)
    torch.backends.cuda.enable_cudnn_sdp(False)  # (conftest's fixture restores the settings)
    assert varlen.kernel_fits(True, torch.bfloat16, 64, 0.0)
    torch.use_deterministic_algorithms(True)
    assert varlen.kernel_fits(True, torch.bfloat16, 64, 0.0)
    assert not varlen.kernel_fits(False, torch.bfloat16, 64, 0.0)  # the CPU: the reference, as always
    assert not varlen.kernel_fits(True, torch.float32, 64, 0.0) and not varlen.kernel_fits(
        True, torch.bfloat16, 64, 0.1
    )


def test_deterministic_mode_with_cudnn_attention_takes_the_reference_and_says_so(monkeypatch, caplog):
    """cuDNN attention enabled: a newer torch's varlen_attn could pick cuDNN, whose backward is not
    deterministic, so the dispatcher takes the per-sequence SDPA reference, logged once."""
    _stand_in_kernel(monkeypatch)
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert varlen.kernel_fits(True, torch.bfloat16, 64, 0.0)  # not deterministic mode: the kernel
    torch.use_deterministic_algorithms(True, warn_only=True)
    assert varlen.kernel_fits(True, torch.bfloat16, 64, 0.0)  # warnings only: torch warns, the kernel runs
    torch.use_deterministic_algorithms(True)
    with caplog.at_level("WARNING", logger="seqtrain.models.varlen"):
        assert not varlen.kernel_fits(True, torch.bfloat16, 64, 0.0)
        assert not varlen.kernel_fits(True, torch.float16, 64, 0.0)
    routed = [r for r in caplog.records if "instead of the varlen kernel" in r.getMessage()]
    assert len(routed) == 1


def test_the_cpu_reference_is_bitwise_repeatable_in_deterministic_mode():
    """The packed CPU path (index_copy into a padded layout, masked SDPA, index_select back) runs under
    use_deterministic_algorithms(True) and gives the same gradients twice, equal to those without it."""
    cu = cu_of(LENGTHS_Q)
    grads = []
    for deterministic in (False, True, True):
        torch.use_deterministic_algorithms(deterministic)
        q, k, v = (packed(LENGTHS_Q, torch.float32, s).requires_grad_() for s in range(3))
        out = varlen_attention(q, k, v, cu, cu, 8, 8, True)
        grads.append([out.detach(), *torch.autograd.grad((out * out).sum(), (q, k, v))])
    for a, b in zip(grads[1], grads[2]):
        assert torch.equal(a, b)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b, **FP32)


def test_the_plan_cache_is_shared_safely_by_threads():
    """A web server calls one model from many threads (FastAPI runs a plain `def` endpoint in a thread pool):
    the cache of the last batches' plans is evicted by one thread at a time (two threads evicting the same
    oldest plan raised KeyError, a 500 for that request), and each thread gets its own batch's plan."""
    import sys
    import threading

    errors: list[BaseException] = []
    lengths = [[1 + (i + j) % 7 for j in range(1 + i % 5)] for i in range(40)]

    def work(t: int) -> None:
        try:
            for n in range(300):
                lens = lengths[(t * 13 + n) % len(lengths)]
                bounds = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
                plan = varlen._plan(bounds, bounds, False)
                assert plan.b == len(lens)
        except BaseException as e:  # noqa: BLE001 (reported below, with the thread's failure)
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(varlen._PLANS) <= 8
