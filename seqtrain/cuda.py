"""CUDA kernel choices shared by training and generation: global torch settings, set once per process."""

from __future__ import annotations

import torch


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
