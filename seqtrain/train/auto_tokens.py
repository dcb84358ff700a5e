"""--max-tokens auto: find the largest token budget whose heaviest batch fits in device memory, before training.

As transformers' auto_find_batch_size and Marian's --mini-batch-fit, but decided once, up front: the probe batch
is the one a budget makes of the longest examples (rows x longest length tokens, the batch that needs the most
memory for its token count, since attention grows with the square of the length). Each probe runs the task's
forward and backward pass on it, holding a reserve for the optimizer state the first update will allocate
(Adam's two fp32 moments per trained parameter), and throws the gradients away; the RNG states are put back, so
the run afterwards is the run a fixed --max-tokens of the chosen value gives. The row count halves on out of
memory until a batch fits, then bisects between the last fit and the first failure; the budget is the largest
fitting rows x longest length. The choice is logged and kept in every checkpoint (extra_state["auto_max_tokens"]):
a resumed run takes it from there and never probes again, so its batches are the first launch's.

Only a CUDA device reports running out of memory as an error (a CPU process is killed by the kernel instead),
so the probe runs on CUDA; tests inject the out-of-memory error on the CPU (tests/unit/train/test_auto_tokens.py).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.train.trainer import AUTO, is_oom, rng_state, set_rng_state

logger = logging.getLogger("seqtrain.train")

AUTO_START = 65536  # the first budget probed (tokens): more than bart_large's batches fit on an 80 GB device
_ADAM_STATE_BYTES = 8  # two fp32 moments per trained parameter


def probe_fits(trainer: Any, sample: dict[str, Any]) -> bool:
    """Whether one forward and backward pass on `sample` fits in device memory. Leaves no gradient, optimizer
    state or RNG draw behind."""
    if trainer.device.type != "cuda":
        raise SeqtrainError(
            "--max-tokens auto probes device memory, which only a CUDA device reports running out of; on the "
            "CPU give a number (e.g. --max-tokens 4096)"
        )
    rng = rng_state()
    failure: str | None = None
    reserve = _optimizer_reserve(trainer)
    try:
        trainer.compute_model.train()
        trainer.zero_grad()
        trainer.task.train_step(
            trainer.prepare_sample(sample),
            trainer._forward_model,
            trainer.criterion,
            trainer.step_context(),
            trainer.get_num_updates(),
            ignore_grad=False,
        )
    except RuntimeError as e:
        if not is_oom(e, trainer.device):
            raise
        failure = str(e).splitlines()[0] if str(e) else type(e).__name__
    # (outside the except block: the traceback's frames hold the pass's tensors until then)
    del reserve
    trainer.zero_grad()
    set_rng_state(rng)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if failure is not None:
        logger.info(f"--max-tokens auto: {sample['nsentences']} rows of the longest examples: out of memory")
    return failure is None


def _optimizer_reserve(trainer: Any) -> torch.Tensor | None:
    """Device memory standing in for the optimizer state the first update allocates (none exists yet)."""
    if trainer.device.type != "cuda" or not torch.cuda.is_available():
        return None
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return torch.empty(trained * _ADAM_STATE_BYTES, dtype=torch.uint8, device=trainer.device)


def longest_first(dataset: Any, max_positions: Any) -> np.ndarray:
    """Indices of the trainable examples (within `max_positions`, a (source, target) pair; None: no limit),
    longest (--max-tokens cost) first."""
    src = np.asarray(dataset.src_sizes)
    tgt = (
        np.asarray(dataset.tgt_sizes)
        if getattr(dataset, "tgt_sizes", None) is not None
        else np.zeros_like(src)
    )
    max_src, max_tgt = (
        x if x is not None else np.iinfo(np.int64).max for x in (max_positions or (None, None))
    )
    kept = np.flatnonzero((src <= max_src) & (tgt <= max_tgt))
    cost = np.maximum(src[kept], tgt[kept])
    return kept[np.argsort(-cost, kind="stable")]


def choose_max_tokens(
    trainer: Any,
    dataset: Any,
    max_positions: Any,
    max_sentences: int | None = None,
    multiple: int = 1,
    start: int = AUTO_START,
) -> int:
    """The largest budget rows x L (L: the longest example's cost) whose batch of the `rows` longest examples
    fits, probing from `start` tokens down. Rows are multiples of `multiple` where batching makes them so
    (--required-batch-size-multiple), at most `max_sentences` (--batch-size) and the number of examples."""
    order = longest_first(dataset, max_positions)
    if not len(order):
        raise SeqtrainError("--max-tokens auto: the training split has no example within the max positions")
    longest = int(dataset.num_tokens(int(order[0])))
    cap = min(len(order), max_sentences or len(order), max(1, start // longest))

    def rows_allowed(r: int) -> int:  # what batch_by_size makes of r rows: a multiple, or fewer than one
        return r - r % multiple if r >= multiple else r

    def fits(r: int) -> bool:
        sample = dataset.collater([dataset[int(i)] for i in order[:r]])
        return probe_fits(trainer, sample)

    rows, failed = rows_allowed(cap), None
    while not fits(rows):
        failed = rows
        if rows == 1:
            raise SeqtrainError(
                f"--max-tokens auto: one example of the longest length ({longest} tokens) does not fit in device "
                "memory; lower --max-source-positions / --max-target-positions (with --truncate-source) or use "
                "--checkpoint-activations"
            )
        rows = rows_allowed(max(1, rows // 2))
    while failed is not None:  # bisect between the fitting `rows` and the first failure
        mid = rows_allowed((rows + failed) // 2)
        if mid <= rows:
            break
        if fits(mid):
            rows = mid
        else:
            failed = mid
    return rows * longest


def resolve_max_tokens(
    trainer: Any, dataset: Any, max_positions: Any, batch_size: int | None, multiple: int
) -> None:
    """Probe a budget for `--max-tokens auto` (a first launch; a resume took the stored one in
    Trainer.load_state_dict) and give it to the trainer (trainer.auto_max_tokens)."""
    if trainer.cfg.max_tokens != AUTO or trainer.auto_max_tokens is not None:
        return
    chosen = choose_max_tokens(trainer, dataset, max_positions, batch_size, multiple)
    logger.info(f"--max-tokens auto: chose {chosen} tokens per batch (the largest batch that fit)")
    trainer.use_auto_max_tokens(chosen)
