"""Launching training: one process today; torchrun and one-process-per-GPU spawning plug in here.

`call_main(args, main)` is the only entry the CLIs use. For a single process it fills the rank fields and calls
`main(args)` directly. Multi-process training is not implemented yet; rather than pretend, a request for it
(--distributed-world-size > 1, or a torchrun environment with WORLD_SIZE > 1) fails with a clear message.

Extension points (marked EXTENSION below) for the distributed issue:
  1. torchrun: read RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR from the environment, init the process group
     (backend --distributed-backend), set args.distributed_rank / device_id, then call main(args).
  2. spawn: with --distributed-world-size N > 1 on one node and no torchrun environment, start N processes with
     torch.multiprocessing.spawn, each doing (1) with its own rank.
  3. The Trainer then wraps the model (DDP with --bucket-cap-mb / --find-unused-parameters, or FSDP for
     --ddp-backend fully_sharded) and sums logging outputs across ranks; train_checkpoints writes on rank 0 only.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from seqtrain.errors import SeqtrainError


def env_world_size() -> int:
    """WORLD_SIZE set by torchrun (1 when absent or malformed)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def is_master(args: argparse.Namespace) -> bool:
    return getattr(args, "distributed_rank", 0) == 0


def call_main(args: argparse.Namespace, main: Callable[[argparse.Namespace], Any]) -> Any:
    """Run `main(args)` in this process (the only mode implemented so far)."""
    world_size = int(getattr(args, "distributed_world_size", 1) or 1)
    if world_size > 1 or env_world_size() > 1:
        # EXTENSION (torchrun / spawn): initialise torch.distributed here and run main on every rank.
        raise SeqtrainError(
            f"multi-process training (--distributed-world-size {max(world_size, env_world_size())}) is not "
            "supported yet; run one process (--distributed-world-size 1, no torchrun)")
    args.distributed_world_size = 1
    args.distributed_rank = 0
    return main(args)
