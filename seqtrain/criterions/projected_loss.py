"""The output projection and the (label-smoothed) NLL in one pass over row chunks: BART's loss path.

For each chunk of hidden rows h (n x C) the forward pass computes the logits h W^T, the loss, and the gradient
of the loss with respect to those logits, which it folds straight into the gradients with respect to h and W.
The backward pass only scales the stored gradients by the incoming one. The N x V logits never exist whole
unless they fit the memory budget, and no N x V tensor is kept for the backward pass.

Chunk size (`chunk_rows`): as many rows as fit a byte budget for the chunk's temporaries (the logits in the
compute dtype, their fp32 copy that becomes the gradient, and its low-precision cast): all rows at once when
they fit. The budget is fixed (`chunk_budget_bytes`): 256 MiB on the CPU, where larger chunks buy no speed,
1 GiB on CUDA (2,624 bf16 rows at V = 50,265 padded to 50,272: matrix products of thousands of rows), or
`--loss-chunk-mb`. So the chunk count, and with it the order in which the weight gradient sums over chunks,
is a function of the shapes and the budget only, never of the memory the device has free at that moment: a
resumed run chunks, and sums, exactly as the unbroken one (it asked cudaMemGetInfo on every call before, and
on CUDA a quarter of the free memory decided).

Precision, matching what autograd does for the model's own F.linear under autocast, without its losses:
- the matrix products run in the autocast dtype (fp16/bf16) when autocast is on, the softmax and loss in fp32;
- the gradient of the logits (softmax - eps_i - c * onehot, |g| <= 1) is multiplied by `grad_scale` (the fp16
  loss scale the trainer will apply to the loss) in fp32 before its cast to fp16, so the label-smoothing term
  eps / (V - 1) ~ 2e-6 at V = 50,265 is not subnormal in fp16; the products are unscaled again in fp32;
  on CUDA the gradient products come out of the tensor cores in fp32 (no fp16 rounding or overflow of a
  column sum over a chunk's thousands of rows; measured on an H200: 4,096 rows under a 2^15 scale overflowed
  fp16 in plain autograd and in the earlier fp16-output products);
- the weight gradient accumulates over chunks in fp32 (fp64 for fp64 inputs) whatever the weight's dtype, also
  when FSDP's mixed precision hands the loss a bf16/fp16 weight; autograd casts it to the weight's dtype once.
On the CPU, an fp16 product that overflows under the scale gives inf, which the trainer's overflow check sees,
as it would for plain autograd under the same scale.

Aligned vocabulary (`align`; default 8 rows on CUDA, none elsewhere: seqtrain.cuda.align_rows, shared with
the static decoding step's output projection): the products run against the weight cast to the compute dtype
and zero-padded to a multiple of `align` rows (once per call, not per chunk: seqtrain.cuda.padded_weight), the
logits' extra columns left out of the softmax and the loss, the gradient's extra columns zero, the weight
gradient's extra rows dropped. The same function, only faster: at BART's odd V = 50,265 no row of the logits
or of the weight gradient is 16-byte aligned, and cuBLAS ran all three products in `cutlass_75 ... align1`
kernels at 96-105 TFLOP/s against 570-800 for the layers' products (an H200 in bf16, 2026-12-04: ~14 ms of a
225-238 ms bart_large update). 8 rows are 16 bytes in fp16/bf16 and twice that in fp32 (TF32 kernels want
16-byte rows too), so CUDA pads whatever the dtype; 7 zero rows cost nothing. The chunk budget counts the
padded width (the logits and the gradient's cast are V8 wide, the fp32 copy V).

`valid` (optional, N booleans) marks the rows that count: the others (padding targets) add nothing to the
loss, the gradients or the accuracy. It lets callers skip the boolean-mask selection of rows, which forces a
host-device sync on CUDA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from seqtrain.cuda import align_rows, padded_weight

CPU_BUDGET_BYTES = 256 << 20
CUDA_BUDGET_BYTES = 1 << 30


def bytes_per_logit(compute_dtype: torch.dtype) -> int:
    """Temporary bytes per logit of a chunk: the logits, their fp32 copy (softmax, then gradient, in place)
    and, in a low precision, the gradient's cast back to it."""
    size = torch.empty((), dtype=compute_dtype).element_size()
    return size if size >= 4 else 2 * size + 4


def chunk_rows(n_rows: int, vocab: int, budget_bytes: int, per_logit: int) -> int:
    """Rows per chunk: all `n_rows` when their logits fit `budget_bytes` at `per_logit` bytes each, else as
    many as fit, rounded down to a multiple of 64 from 64 rows up (matrix-product tile sizes), at least 1."""
    n_rows = max(1, n_rows)
    fit = budget_bytes // max(1, vocab * per_logit)
    if fit >= n_rows:
        return n_rows
    if fit >= 64:
        fit -= fit % 64
    return max(1, int(fit))


def chunk_budget_bytes(device: torch.device, budget_mb: float | None = None) -> int:
    """Bytes the loss's chunk temporaries may take on `device`: `budget_mb` MiB when given (--loss-chunk-mb),
    else CPU_BUDGET_BYTES or CUDA_BUDGET_BYTES. A constant for a run: no free-memory query (see the module
    docstring)."""
    if budget_mb is not None:
        return max(1, int(budget_mb * (1 << 20)))
    return CUDA_BUDGET_BYTES if device.type == "cuda" else CPU_BUDGET_BYTES


def compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype F.linear(hidden, weight) produces here: autocast's when it is on for hidden's device."""
    kind = hidden.device.type
    if hidden.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return hidden.dtype


def _product(a: Tensor, b: Tensor, acc: torch.dtype) -> Tensor:
    """a @ b for the gradients, `a` in the compute dtype. On CUDA with fp16/bf16 operands the product comes out
    in `acc` (fp32) straight from the tensor cores' fp32 accumulators (torch.mm's out_dtype): a column sum over
    thousands of rows under a 2^15 loss scale can pass fp16's 65,504 where every term is far below it, and
    plain autograd's fp16 output would overflow there. Elsewhere the product runs as autocast would run it
    (the weight cast, cached, as for F.linear), in the compute dtype."""
    if a.is_cuda and a.dtype in (torch.float16, torch.bfloat16) and _mm_out_dtype_works():
        return torch.mm(a, b.to(a.dtype), out_dtype=acc)
    return torch.matmul(a, b)


_MM_OUT_DTYPE: bool | None = None


def _mm_out_dtype_works() -> bool:
    """Whether this torch has torch.mm(..., out_dtype=) for low-precision CUDA operands (torch >= 2.8)."""
    global _MM_OUT_DTYPE
    if _MM_OUT_DTYPE is None:
        try:
            x = torch.ones(1, 1, dtype=torch.float16, device="cuda")
            _MM_OUT_DTYPE = torch.mm(x, x, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE = False
    return _MM_OUT_DTYPE


class _ProjectedSmoothedNLL(torch.autograd.Function):
    """See the module docstring. Returns (loss sum, nll sum, number of correct argmax predictions; 0 unless
    `accuracy`); the loss is fairseq's (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v),
    eps_i = eps / (V - 1)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        valid: Tensor | None,
        epsilon: float,
        chunk: int,
        need_grad: bool,
        accuracy: bool,
        grad_scale: float,
        align: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, vocab = hidden.size(0), weight.size(0)
        pad = -vocab % align
        w_mm = padded_weight(weight, align, compute_dtype(hidden)) if pad else weight  # once per call
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        c_target = 1.0 - epsilon - eps_i
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        nll_sum = torch.zeros((), dtype=acc, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grad_h = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_grad else None
        for start in range(0, n, chunk):
            h, t = hidden[start : start + chunk], target[start : start + chunk]
            zf = torch.nn.functional.linear(h, w_mm)
            z = zf[:, :vocab] if pad else zf  # (a view: the padded columns take no part in the loss)
            x = z if z.dtype == acc else z.to(acc)
            lse = torch.logsumexp(x, dim=-1)
            nll = lse - x.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            row_loss = c_target * nll + eps_i * (vocab * lse - x.sum(dim=-1)) if epsilon > 0 else nll
            v = None if valid is None else valid[start : start + chunk]
            if v is not None:
                nll, row_loss = nll * v, row_loss * v
            nll_sum += nll.sum()
            loss += row_loss.sum()
            if accuracy:
                hits = x.argmax(-1).eq(t)
                correct += (hits if v is None else hits & v).sum()
            if need_grad:
                g = x.sub_(lse.unsqueeze(-1)).exp_()  # softmax, in place of the logits
                if eps_i:
                    g.sub_(eps_i)
                g.scatter_add_(-1, t.unsqueeze(-1), g.new_full((g.size(0), 1), -c_target))
                if v is not None:
                    g.mul_(v.unsqueeze(-1))
                low = z.dtype != acc
                if low and grad_scale != 1.0:
                    g.mul_(grad_scale)  # the loss scale, before the cast (|g| <= 1)
                if not pad:
                    g_mm = g.to(z.dtype)
                elif g.dtype == zf.dtype:  # g was computed in place in zf's first columns: zero the others
                    g_mm = zf
                    g_mm[:, vocab:] = 0
                else:  # the cast into an aligned buffer (as g.to(z.dtype) unpadded) whose extra columns are zero
                    g_mm = g.new_empty((g.size(0), vocab + pad), dtype=z.dtype)
                    g_mm[:, :vocab] = g
                    g_mm[:, vocab:] = 0
                del g
                unscale = 1.0 / grad_scale if low else 1.0
                gh = _product(g_mm, w_mm, acc)
                grad_h[start : start + chunk] = gh.to(acc).mul_(unscale) if unscale != 1.0 else gh
                gw = _product(g_mm.t(), h, acc)
                grad_w.add_(gw[:vocab] if pad else gw, alpha=unscale)
            del zf, z, x
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll_sum, correct)
        return loss, nll_sum, correct

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _g1: Any, _g2: Any) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is None:
            raise RuntimeError(
                "backward through a projected loss computed without gradients (need_grad=False)"
            )
        scale = grad_loss.to(grad_h.dtype)
        h_dtype, w_dtype = ctx.dtypes
        return (
            (grad_h * scale).to(h_dtype),
            (grad_w * scale).to(w_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def projected_nll_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float = 0.0,
    valid: Tensor | None = None,
    rows: int | None = None,
    accuracy: bool = False,
    grad_scale: float = 1.0,
    budget_mb: float | None = None,
    align: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed (loss, nll, n_correct) of the rows `hidden` (N x C) projected by `weight` (V x C, no bias), only
    rows where `valid` is true counted when it is given; n_correct (the argmax pass over the logits) only with
    `accuracy`, else 0. Equal to smoothed_nll_loss(hidden @ weight.T, target, epsilon) summed, computed `rows`
    rows at a time (default: from the shapes and the byte budget, see chunk_rows and chunk_budget_bytes;
    `budget_mb` overrides the device's budget). `grad_scale`: the factor the loss will be scaled by before
    backward (the fp16 loss scale), applied to the low-precision gradient casts. `align`: the products run
    against the weight zero-padded to a multiple of this many rows (default: align_rows; see the module
    docstring)."""
    align = align_rows(hidden.device, align)
    if rows is None:
        per_logit = bytes_per_logit(compute_dtype(hidden))
        budget = chunk_budget_bytes(hidden.device, budget_mb)
        vocab = weight.size(0)
        rows = chunk_rows(hidden.size(0), vocab + (-vocab % align), budget, per_logit)  # at the padded width
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ProjectedSmoothedNLL.apply(
        hidden,
        weight,
        target,
        valid,
        float(epsilon),
        max(1, int(rows)),
        need_grad,
        accuracy,
        float(grad_scale),
        align,
    )
