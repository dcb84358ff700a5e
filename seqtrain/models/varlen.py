"""Attention over packed variable-length sequences: one dispatcher, torch's FA2 varlen kernel where it serves.

Training runs packed end to end (models/bart.py): every layer sees only the N real tokens of a batch (N x C),
and a batch's sequences are told apart by `cu_seqlens` (int32, B + 1 cumulative lengths, sequence i holds rows
cu[i]..cu[i+1]). Attention is the one place that needs the segments; `varlen_attention` gives it them:

- on CUDA in fp16/bf16 without attention dropout, `torch.nn.attention.varlen.varlen_attn` (FA2's varlen kernel):
  no mask, no padded FLOPs, no scatter into a padded layout. Its signature changed between torch versions
  (causal masking as `is_causal=True` in some, `window_size=(-1, 0)` in others), so `varlen_kernel()` probes it
  once and adapts;
- elsewhere (the CPU, fp32/fp64, attention dropout > 0) the exact reference: SDPA on each segment (eagerly on
  the CPU: one masked SDPA over the segments laid out B x T, `padded_reference`, the same to rounding and
  faster than a loop). Without dropout it runs as the custom op `seqtrain::varlen_attention` (with a fake
  implementation and its backward as a second op), so torch.compile traces the CPU run as one opaque attention
  node per call, as it traces the GPU run's varlen kernel, and a compiled layer has the same graph on both.

Tensors: q N x H x d, k and v M x H x d (M = N for self-attention), cu_q / cu_k int32 B + 1 on q's device
(the kernel reads them there), and `bounds_q` / `bounds_k` the same values kept on the host (the collater's
`*_cu_seqlens_host`, which Trainer.prepare_sample leaves there): the reference reads its segment bounds from
them, so it never waits for the device either. `max_q` / `max_k` are host ints at least the longest segment
(the collater rounds them up, pair_dataset.LENGTH_BUCKET, so shapes repeat; the kernel only sizes its grid by
them, the reference ignores them; in a compiled layer they are symbolic ints, see transformer._DynamicTokens).
Causal masking is within each segment (query j sees keys 0..j of its own sequence).

Why a module of its own: the kernel choice, the version probe and the reference must agree on one contract
(segments, causal alignment, scale), and tests/unit/models/test_varlen.py checks all three against it.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrain.cuda import strictly_deterministic

logger = logging.getLogger(__name__)

VarlenKernel = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int, int, bool], Tensor]


def _segments(cu: Tensor) -> list[tuple[int, int]]:
    """(start, end) row ranges of the segments of `cu` (host bounds: no sync)."""
    bounds = cu.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, causal: bool, dropout_p: float = 0.0
) -> Tensor:
    """The exact reference: SDPA on each (query segment, key segment) pair, N x H x d_v. Rows outside every
    segment (none, from the collater) stay zero."""
    out = q.new_zeros(q.size(0), q.size(1), v.size(-1))
    for (qa, qb), (ka, kb) in zip(_segments(cu_q), _segments(cu_k)):
        if qb == qa:
            continue
        o = F.scaled_dot_product_attention(
            q[qa:qb].transpose(0, 1),
            k[ka:kb].transpose(0, 1),
            v[ka:kb].transpose(0, 1),
            dropout_p=dropout_p,
            is_causal=causal,
        )
        out[qa:qb] = o.transpose(0, 1)
    return out


@torch.library.custom_op("seqtrain::varlen_attention", mutates_args=())
def varlen_attention_op(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, causal: bool
) -> Tensor:
    """reference_attention without dropout, as one operator (see the module docstring). It takes the max
    lengths as the kernel does and ignores them: so a compiled layer reads them on the CPU as on the GPU, and
    the CPU tests see what the GPU's graph depends on (a max length that recompiles, tests/unit/models/
    test_compile_layers.py)."""
    return reference_attention(q, k, v, cu_q, cu_k, causal)


@varlen_attention_op.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, causal: bool
) -> Tensor:
    return q.new_empty(q.size(0), q.size(1), v.size(-1))


@torch.library.custom_op("seqtrain::varlen_attention_backward", mutates_args=())
def varlen_attention_backward_op(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of varlen_attention_op for q, k, v: each segment's attention probabilities recomputed (as
    flash attention does: nothing of the forward pass is kept) and differentiated by hand, since an operator's
    body runs below autograd."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale = q.size(-1) ** -0.5
    acc = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # softmax's precision
    for (qa, qb), (ka, kb) in zip(_segments(cu_q), _segments(cu_k)):
        if qb == qa:
            continue
        qs, ks, vs, g = (t.transpose(0, 1).to(acc) for t in (q[qa:qb], k[ka:kb], v[ka:kb], grad[qa:qb]))
        p = _probabilities(qs, ks, scale, causal)  # H x n x m
        o = p @ vs
        dv[ka:kb] = (p.transpose(1, 2) @ g).transpose(0, 1)
        dp = g @ vs.transpose(1, 2)
        ds = p * (dp - (g * o).sum(-1, keepdim=True))  # softmax's backward: rowsum(dP * P) = rowsum(dO * O)
        dq[qa:qb] = (ds @ ks).mul_(scale).transpose(0, 1)
        dk[ka:kb] = (ds.transpose(1, 2) @ qs).mul_(scale).transpose(0, 1)
    return dq, dk, dv


def _probabilities(q: Tensor, k: Tensor, scale: float, causal: bool) -> Tensor:
    """softmax(q k^T * scale) of one segment (H x n x m), causal as SDPA's is_causal (top-left aligned)."""
    scores = (q @ k.transpose(1, 2)).mul_(scale)
    if causal:
        n, m = scores.shape[-2:]
        above = torch.ones(n, m, dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(above, float("-inf"))
    return scores.softmax(-1)


@varlen_attention_backward_op.register_fake
def _(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q, k, v, cu_q, cu_k, _, _, causal = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k)
    ctx.causal = causal


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = varlen_attention_backward_op(grad.contiguous(), q, k, v, cu_q, cu_k, ctx.causal)
    return dq, dk, dv, None, None, None, None, None


varlen_attention_op.register_autograd(_backward, setup_context=_setup_context)


def adapt_varlen_attn(fn: Callable[..., Any]) -> VarlenKernel | None:
    """`fn` (torch.nn.attention.varlen.varlen_attn, or a stand-in with its signature) as
    kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal), or None when its signature offers no causal switch we
    know: `is_causal=` (some torch versions) or `window_size=(left, right)` ((-1, 0) is causal; others)."""
    params = inspect.signature(fn).parameters
    if "is_causal" in params:

        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal):  # type: ignore[no-untyped-def]
            return fn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=causal)

    elif "window_size" in params:

        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal):  # type: ignore[no-untyped-def]
            return fn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0) if causal else (-1, -1))

    else:
        return None
    return kernel


_KERNEL: list[VarlenKernel | None] = []  # the probed kernel, once per process


def varlen_kernel() -> VarlenKernel | None:
    """torch's varlen kernel adapted to our call (adapt_varlen_attn), or None when this torch has none."""
    if not _KERNEL:
        try:
            from torch.nn.attention.varlen import varlen_attn  # not in every torch: probed, not assumed
        except ImportError:
            _KERNEL.append(None)
        else:
            _KERNEL.append(adapt_varlen_attn(varlen_attn))
    return _KERNEL[0]


def kernel_serves(q: Tensor, dropout_p: float) -> bool:
    """Whether the varlen kernel runs this call (kernel_fits on q's device, dtype and head size)."""
    return kernel_fits(q.is_cuda, q.dtype, q.size(-1), dropout_p)


def kernel_fits(is_cuda: bool, dtype: torch.dtype, head_dim: int, dropout_p: float) -> bool:
    """Whether the varlen kernel can run a call: CUDA, fp16/bf16, a head size FA2 takes, no dropout, and a
    deterministic backward when deterministic algorithms are required (deterministic_kernel)."""
    return (
        is_cuda
        and dtype in (torch.float16, torch.bfloat16)
        and dropout_p == 0.0
        and head_dim % 8 == 0
        and head_dim <= 256
        and varlen_kernel() is not None
        and (not strictly_deterministic() or deterministic_kernel())
    )


_ROUTED: list[bool] = []  # the deterministic reroute has been logged (once per process)


def deterministic_kernel() -> bool:
    """Under use_deterministic_algorithms(True) without warn_only (--deterministic): whether torch's varlen
    kernel has a deterministic backward. FA2's has: torch's _flash_attention_backward then runs FA2's
    deterministic dQ accumulation (one fp32 buffer per split, summed in a fixed order, instead of atomic adds),
    for the varlen kernel as for SDPA's flash. cuDNN's has not (SDPA leaves it out in this mode), and torch
    versions after 2.13 let varlen_attn pick cuDNN where torch.backends.cuda.cudnn_sdp_enabled() (2.11-2.13
    always run FA2). So with cuDNN attention enabled the dispatcher takes the reference (SDPA per segment,
    flash or memory-efficient, both deterministic in this mode) and says so once; the Trainer keeps cuDNN off
    under --deterministic (it refuses --cudnn-attention with it), so training runs the kernel."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return True
    if not _ROUTED:
        _ROUTED.append(True)
        logger.warning(
            "deterministic algorithms with cuDNN attention enabled: packed attention runs SDPA per sequence "
            "(deterministic) instead of the varlen kernel, which could pick cuDNN's non-deterministic backward"
        )
    return False


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    max_q: int,
    max_k: int,
    causal: bool,
    dropout_p: float = 0.0,
    bounds_q: Tensor | None = None,
    bounds_k: Tensor | None = None,
) -> Tensor:
    """Attention of packed queries to packed keys/values segment by segment (see the module docstring);
    N x H x d_v. With dropout_p > 0 off the kernel, the reference runs under plain autograd (dropout draws
    from torch's RNG, which an operator's recomputed backward could not repeat); under torch.compile that is a
    graph break, which BART's settings (attention dropout 0) never meet."""
    kernel = varlen_kernel() if kernel_serves(q, dropout_p) else None
    if kernel is not None:
        return kernel(q, k, v, cu_q, cu_k, max_q, max_k, causal)
    bounds_q = cu_q if bounds_q is None else bounds_q  # (no host copy: reading the device's is a sync)
    bounds_k = cu_k if bounds_k is None else bounds_k
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        return padded_reference(q, k, v, bounds_q, bounds_k, causal, dropout_p)
    if dropout_p > 0.0:
        return reference_attention(q, k, v, bounds_q, bounds_k, causal, dropout_p)
    return varlen_attention_op(q, k, v, bounds_q, bounds_k, max_q, max_k, causal)


def _padded_rows(lengths: list[int]) -> tuple[Tensor, int]:
    """(for each packed row of segments of these lengths its row in a B x T padded layout, T), in Python from
    host bounds: tensor arithmetic on them would read scalars back (`int(t.max())`, `repeat_interleave`), which
    the sync checks (tests/unit/train/test_sync_free.py, the GPU check's sync_count) count as syncs."""
    longest = max(lengths, default=0)
    rows = [i * longest + j for i, n in enumerate(lengths) for j in range(n)]
    return torch.tensor(rows, dtype=torch.long), longest


def _runs(lengths: list[int]) -> list[tuple[int, int]]:
    """(first segment, segments) of each run of consecutive segments of equal length."""
    runs: list[tuple[int, int]] = []
    for i, n in enumerate(lengths):
        if runs and lengths[runs[-1][0]] == n:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


# Up to this many runs of equal key lengths a batch attends run by run (views, no copies), else laid out padded.
MAX_RUNS = 4


class _Plan:
    """How the eager CPU path lays out one batch's attention (computed once per batch: every layer gets the
    same host bounds objects from the collater's layout, so the index arithmetic is not repeated per call).

    Length-bucketed batches (fairseq's order, what training reads) have keys of one or a few lengths: runs of
    equal-length segments are consecutive rows, so each run is a view (r x L x H x d) of the packed tensor and
    attends without a mask or a copy (`groups`: per run its query rows, its key rows, r, the key length, and, when
    its queries differ in length, their rows in an r x T_q zero-padded copy; padded queries attend the real keys,
    and their outputs are dropped). Otherwise (`groups` None) the whole batch is laid out B x T (`rows_q`, `rows_k`)
    with a key mask; causal self-attention needs no mask there, as a real query at position j sees keys 0..j of its
    own row, all real."""

    def __init__(self, bounds_q: list[int], bounds_k: list[int], causal: bool):
        len_q = [b - a for a, b in zip(bounds_q[:-1], bounds_q[1:])]
        len_k = [b - a for a, b in zip(bounds_k[:-1], bounds_k[1:])]
        self.b = len(len_k)
        runs = _runs(len_k)
        self.groups: list[tuple[int, int, int, int, int, Tensor | None]] | None = None
        if len(runs) <= MAX_RUNS:
            self.groups = []
            for first, r in runs:
                lq = len_q[first : first + r]
                if len(set(lq)) == 1:
                    rows, tq = None, lq[0]
                else:
                    rows, tq = _padded_rows(lq)
                n_q = bounds_q[first + r] - bounds_q[first]
                n_k = bounds_k[first + r] - bounds_k[first]
                self.groups.append((n_q, n_k, r, len_k[first], tq, rows))
            return
        self.rows_q, self.tq = _padded_rows(len_q)
        self.rows_k, self.tk = _padded_rows(len_k)
        self.mask: Tensor | None = None
        if not causal:
            self.mask = (torch.arange(self.tk) < torch.tensor(len_k)[:, None]).view(self.b, 1, 1, self.tk)


_PLANS: dict[tuple[int, int, bool], tuple[Tensor, Tensor, _Plan]] = {}  # the last few batches' plans
# held while _PLANS is read or changed: a server generates from many threads (two evicting the same oldest plan
# raised KeyError)
_PLANS_LOCK = threading.Lock()


def _plan(bounds_q: Tensor, bounds_k: Tensor, causal: bool) -> _Plan:
    key = (id(bounds_q), id(bounds_k), causal)
    with _PLANS_LOCK:
        hit = _PLANS.get(key)
    if hit is not None and hit[0] is bounds_q and hit[1] is bounds_k:  # (the objects, not a reused id)
        return hit[2]
    plan = _Plan(bounds_q.tolist(), bounds_k.tolist(), causal)
    with _PLANS_LOCK:
        while len(_PLANS) >= 8:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = (bounds_q, bounds_k, plan)
    return plan


def _laid_out(x: Tensor, rows: Tensor | None, b: int, t: int) -> Tensor:
    """Packed rows (n x H x d) as b x H x t x d: a view when they fill it (`rows` None), else a zero-padded copy."""
    if rows is not None:
        x = x.new_zeros(b * t, *x.shape[1:]).index_copy(0, rows, x)
    return x.view(b, t, *x.shape[1:]).transpose(1, 2)


def _packed_rows(o: Tensor, rows: Tensor | None) -> Tensor:
    """b x H x t x d back to the packed rows (n x H x d)."""
    o = o.transpose(1, 2).reshape(-1, o.size(1), o.size(-1))
    return o if rows is None else o.index_select(0, rows)


def padded_reference(
    q: Tensor, k: Tensor, v: Tensor, bounds_q: Tensor, bounds_k: Tensor, causal: bool, dropout_p: float = 0.0
) -> Tensor:
    """reference_attention as a few batched SDPA calls under plain autograd (the eager CPU path; torch.compile
    traces the operator instead): run by run of equal key lengths, or the whole batch laid out B x T with a key
    mask (see _Plan). The same attention to rounding, but batched kernels instead of a Python loop over segments
    with a hand-written backward (which made the packed path slower than padded on length-bucketed CPU batches,
    0.91x, scripts/bench/bench_packing.py), and no copies for the runs, whose keys a bucketed batch mostly is."""
    plan = _plan(bounds_q, bounds_k, causal)
    if plan.groups is None:
        o = F.scaled_dot_product_attention(
            _laid_out(q, plan.rows_q, plan.b, plan.tq),
            _laid_out(k, plan.rows_k, plan.b, plan.tk),
            _laid_out(v, plan.rows_k, plan.b, plan.tk),
            attn_mask=plan.mask,
            dropout_p=dropout_p,
            is_causal=causal,
        )
        return _packed_rows(o, plan.rows_q)
    qs = q.split([g[0] for g in plan.groups])
    ks = k.split([g[1] for g in plan.groups])
    vs = v.split([g[1] for g in plan.groups])
    outs = []
    for (n_q, _, r, tk, tq, rows), qg, kg, vg in zip(plan.groups, qs, ks, vs):
        if n_q == 0:
            continue
        o = F.scaled_dot_product_attention(
            _laid_out(qg, rows, r, tq),
            _laid_out(kg, None, r, tk),
            _laid_out(vg, None, r, tk),
            dropout_p=dropout_p,
            is_causal=causal,
        )
        outs.append(_packed_rows(o, rows))
    if not outs:
        return q.new_zeros(q.size(0), q.size(1), v.size(-1))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
