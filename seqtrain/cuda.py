"""CUDA kernel choices shared by training and generation: global torch settings, set once per process, and the
row alignment of the vocabulary products (the projected loss's and the static decoding step's)."""

from __future__ import annotations

import os
import re

import torch

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.flag_bounds import Bounds

CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the values torch accepts (cuBLAS reproducibility docs)


@settings
class DeviceConfig:
    """Common: the device, precision and kernels of a training or generation process (and its seed)"""

    seed: int = setting(1, "random seed (default: 1)", type=int, metavar="N", bounds=Bounds(0, 2**32 - 1))
    cpu: bool = setting(False, "use the CPU even when CUDA is available", action="store_true")
    fp16: bool = setting(False, "fp16 autocast with dynamic loss scaling (CUDA)", action="store_true")
    bf16: bool = setting(
        False,
        "bf16, no loss scaling (CUDA or CPU). Training: autocast over fp32 weights, or with --bf16-mode "
        "fairseq as fairseq's --bf16 (a bf16 model over fp32 master weights); generation: the model cast to bf16",
        action="store_true",
    )
    memory_efficient_fp16: bool = setting(
        False,
        "accepted for fairseq command lines; implies --fp16 (seqtrain always keeps fp32 master weights "
        "and optimizer state, with fp16 autocast)",
        action="store_true",
    )
    memory_efficient_bf16: bool = setting(
        False, "accepted for fairseq command lines; implies --bf16", action="store_true"
    )
    compile: bool = setting(
        False,
        "torch.compile each encoder and decoder layer of the packed training path (CPU or CUDA; "
        "the criterion, the optimizer and generation stay eager)",
        action="store_true",
        not_in=("generate", "interactive", "tune"),
    )
    no_tf32: bool = setting(
        False,
        "keep fp32 matrix products in full fp32 on CUDA (default: TF32 tensor cores, as on Ampere+)",
        action="store_true",
    )
    cudnn_attention: bool = setting(
        False,
        "let attention use cuDNN's kernel on CUDA (default: off; it builds a plan, 0.1-0.4 s, for every "
        "new batch shape)",
        action="store_true",
    )
    deterministic: bool = setting(
        False,
        "deterministic kernels (torch.use_deterministic_algorithms without warn_only, cuDNN "
        "deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset): two runs from the same state are "
        "bitwise equal on a GPU too, at a cost (docs/training.md); an operator without a deterministic "
        "kernel stops the run",
        action="store_true",
    )


BF16_MODES = ("autocast", "fairseq")


@settings
class Bf16ModeConfig:
    """Common: how seqtrain-train runs --bf16 (seqtrain.train.precision; generation always casts the model)"""

    bf16_mode: str = setting(
        "autocast",
        "with --bf16: autocast (fp32 weights, each matrix product cast to bf16), or fairseq (as fairseq's "
        "--bf16: the model computes in bf16, the optimizer steps fp32 master weights, which checkpoints hold)",
        choices=BF16_MODES,
    )


def set_cuda_kernels(tf32: bool | None, cudnn_attention: bool) -> None:
    """The CUDA kernel choices of a training or generation process (global torch settings):
    - `tf32`: fp32 matrix products on tensor cores (TF32, 10-bit mantissa), as fairseq users get by default on
      Ampere and later; --no-tf32 keeps them in full fp32. None leaves torch's setting (generation: fp32
      decoding stays fp32, so its hypotheses are those of the CPU and of fairseq-generate).
    - `cudnn_attention`: whether scaled_dot_product_attention may pick cuDNN's kernel. torch 2.11 (seen on an
      H200) tries it first on Hopper for fp16/bf16 with a mask; cuDNN then builds an execution plan for every
      new (batch, length) shape, about 0.1-0.4 s each (measured on an H200: bart_base steps of varying length
      took 307 ms with it against 88 ms without, and bf16 beam search ran 4x slower than fp32). Length-bucketed
      batches and incremental decoding meet a new shape almost every step, so it stays off unless
      --cudnn-attention; the flash and memory-efficient kernels need no plan."""
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)


def set_deterministic() -> None:
    """--deterministic: every kernel deterministic, so two runs from the same state are bitwise equal on a GPU
    too (on the CPU they already are). Global settings of this process; call it in every rank before its
    first CUDA work (the launcher calls it before it starts ranks, so spawned ranks inherit the variable, and
    the Trainer again in each rank, whose torch settings a spawned interpreter does not inherit):
    - torch.use_deterministic_algorithms(True, warn_only=False): an operator with only a non-deterministic
      kernel raises (Trainer turns that into one line naming the flag), and those with a deterministic one
      switch to it: flash attention's backward (FA2's deterministic dQ accumulation, the varlen kernel's
      too), memory-efficient attention's backward (one key split), index_add_/index_put_(accumulate)/
      scatter_add_ on CUDA (sorted, no atomics), and SDPA leaves cuDNN's attention out;
    - cudnn.deterministic = True, cudnn.benchmark = False;
    - CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset: cuBLAS reads it when it makes its first handle, so it must
      be in the environment before this process's first matrix product on CUDA. Set later (CUDA already
      started here) it might come too late, which is refused with one line: export it before launching.
    Unrelated to TF32 (deterministic too) and to the RNG (seeded per update anyway)."""
    value = os.environ.get(CUBLAS_VAR)
    if value is None:
        if torch.cuda.is_initialized():
            raise SeqtrainError(
                f"--deterministic: {CUBLAS_VAR} must be set before CUDA starts in this process (cuBLAS reads "
                f"it once); export {CUBLAS_VAR}={CUBLAS_DETERMINISTIC[0]} before launching"
            )
        os.environ[CUBLAS_VAR] = CUBLAS_DETERMINISTIC[0]
    elif value not in CUBLAS_DETERMINISTIC:
        raise SeqtrainError(
            f"--deterministic: {CUBLAS_VAR}={value!r} is not a deterministic cuBLAS setting; use "
            f"{' or '.join(CUBLAS_DETERMINISTIC)}, or leave it unset"
        )
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def strictly_deterministic() -> bool:
    """Whether operators must be deterministic now (use_deterministic_algorithms(True) without warn_only)."""
    return (
        torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled()
    )


_NOT_DETERMINISTIC = re.compile(r"^(\S+) does not have a deterministic implementation")


def nondeterministic_error(e: BaseException) -> SeqtrainError | None:
    """The one-line error for torch's refusal of an operator under --deterministic (`e`), or None when `e` is
    another error. torch names the operator ("put_ does not have a deterministic implementation, but you set
    'torch.use_deterministic_algorithms(True)'. ..."), or says cuBLAS needs CUBLAS_WORKSPACE_CONFIG."""
    text = str(e)
    if "use_deterministic_algorithms" not in text or not isinstance(e, RuntimeError):
        return None
    match = _NOT_DETERMINISTIC.match(text)
    if match:
        return SeqtrainError(
            f"--deterministic: {match.group(1)} has no deterministic implementation in torch "
            f"{torch.__version__}; train without --deterministic (runs are then equal only up to summation order)"
        )
    if CUBLAS_VAR in text:
        return SeqtrainError(
            f"--deterministic: cuBLAS is not deterministic without {CUBLAS_VAR}; export "
            f"{CUBLAS_VAR}={CUBLAS_DETERMINISTIC[0]} before launching"
        )
    return SeqtrainError(f"--deterministic: {text.splitlines()[0]}")


# ------------------------------------------------------------------------------ aligned vocabulary products
CUDA_ALIGN_ROWS = 8  # 8 fp16/bf16 elements: the 16 bytes cuBLAS's fast kernels want for every row


def align_rows(device: torch.device, align: int | None = None) -> int:
    """The multiple a vocabulary weight's rows are padded to for its products on `device`: `align` when given,
    else CUDA_ALIGN_ROWS on CUDA and 1 (no padding) elsewhere (the CPU's products keep their arithmetic, which
    the fairseq parity tests pin). At BART's odd V = 50,265 no row of the logits is 16-byte aligned and cuBLAS
    runs align1 kernels (~100 TFLOP/s against 570-800 aligned, an H200 in bf16, 2026-12-04)."""
    if align is not None:
        return max(1, int(align))
    return CUDA_ALIGN_ROWS if device.type == "cuda" else 1


def padded_weight(weight: torch.Tensor, align: int, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (V x C) in `dtype`, zero-padded to a multiple of `align` rows: one new tensor, one cast. In the
    compute dtype, so that neither F.linear under autocast nor a gradient product casts it again (a padded
    copy is no leaf, and autocast caches the casts of leaves only); the extra logits are zero."""
    vocab = weight.size(0)
    out = weight.new_empty((vocab + (-vocab % align), weight.size(1)), dtype=dtype)
    out[:vocab] = weight.detach()
    out[vocab:] = 0
    return out
