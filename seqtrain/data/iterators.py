"""Epoch iterators over frozen batches: per-epoch shuffling, sharding across ranks, exact resume.

Batches (lists of example indices) are computed once; each epoch only reorders them with a RNG seeded from
`seed + epoch` (fairseq's choice, so the order is identical to fairseq's for the same batches and seed).
The position inside an epoch is a batch count, so resuming skips batches by index without reading or collating
any of them.

Sharding: rank r takes batches r, r + num_shards, ... of the (shuffled) epoch. When the count does not divide
evenly, short ranks get *empty* batches (`[]`, collated to `{}`) at the end, as fairseq's ShardedIterator does,
so every rank runs the same number of steps; the trainer must treat `{}` as a dummy step with zero loss (so
gradient all-reduce still happens) rather than skip it. Repeating a real batch instead would count its examples
twice.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.workers import child_context, ignore_stop_signals, stop_signals_held

logger = logging.getLogger(__name__)


class CountingIterator:
    """Wraps an iterator and counts what it has yielded; `n` starts at `start` when resuming mid-epoch."""

    def __init__(self, iterable: Iterable, start: int = 0, total: int | None = None):
        self._itr = iter(iterable)
        self.n = start
        self.total = total if total is not None else start + len(iterable)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> Any:
        if not self.has_next():
            raise StopIteration
        try:
            item = next(self._itr)
        except StopIteration:
            raise IndexError(f"iterator ended at {self.n}, expected {self.total} items") from None
        self.n += 1
        return item

    def has_next(self) -> bool:
        return self.n < self.total

    def skip(self, k: int) -> CountingIterator:
        for _ in range(k):
            next(self)
        return self

    def take(self, k: int) -> CountingIterator:
        """Stop after `k` items in all (e.g. --max-update reached mid-epoch)."""
        self.total = min(self.total, k)
        return self


class GroupedIterator:
    """Yields lists of `chunk_size` consecutive items (gradient accumulation, --update-freq). `merge`, when
    given, turns each list into the batches its update runs as passes (LanguagePairDataset.merge_update,
    --merge-max-tokens); the count and the resume position stay the items'."""

    def __init__(
        self,
        itr: CountingIterator,
        chunk_size: int,
        merge: Callable[[list[Any]], list[Any]] | None = None,
    ):
        self.itr = itr
        self.chunk_size = chunk_size
        self.merge = merge
        self.n = math.ceil(itr.n / chunk_size)
        self.total = math.ceil(len(itr) / chunk_size)

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> GroupedIterator:
        return self

    def __next__(self) -> list[Any]:
        chunk = list(itertools.islice(self.itr, self.chunk_size))
        if not chunk:
            raise StopIteration
        self.n += 1
        return chunk if self.merge is None else self.merge(chunk)

    def has_next(self) -> bool:
        return self.itr.has_next()


class _BackgroundIterator:
    """Prepares up to `size` batches ahead in a thread, so collating overlaps with the training step. `close()`
    stops and joins the thread, so none is left inside a collate (or a DataLoader) when the process exits."""

    _END = object()

    def __init__(self, iterable: Iterable, size: int):
        self._queue: queue.Queue = queue.Queue(size)
        self._len = len(iterable)  # type: ignore[arg-type]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(iter(iterable),), daemon=True)
        self._thread.start()

    def _fill(self, it: Iterator) -> None:
        try:
            for item in it:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)

    def _put(self, item: Any) -> bool:
        """Queue `item` unless closed (checked every 0.1 s while the queue is full); False once closed."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self, timeout: float = 60.0) -> None:
        """Stop preparing batches and wait (up to `timeout` s) for the thread to finish its current one."""
        self._closed.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(f"a data-loading thread did not stop within {timeout:.0f} s; leaving it behind")

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> _BackgroundIterator:
        return self

    def __next__(self) -> Any:
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item


def pinned(x: Any) -> Any:
    """`x` (a collated batch) with every tensor in page-locked memory, so copies to CUDA run asynchronously."""
    if torch.is_tensor(x):
        return x.pin_memory()
    if isinstance(x, dict):
        return {k: pinned(v) for k, v in x.items()}
    if isinstance(x, list):
        return [pinned(v) for v in x]
    return x


# What a forked DataLoader worker inherits but never reads: sources of tensors (bound methods, held weakly).
_SPARED: list[weakref.WeakMethod] = []


def spare_data_workers(tensors: Callable[[], Iterable[torch.Tensor]]) -> None:
    """Register `tensors`, a bound method that returns tensors this process owns and data workers never read
    (a trainer's weights, gradients and optimizer state); each forked DataLoader worker frees its copies of
    the CPU ones as it starts. Otherwise a worker forked after the model exists keeps, copy-on-write, every page
    of the weights the trainer then rewrites: one more copy of the weights in the process tree (three after a
    resume, with Adam's two moments)."""
    _SPARED[:] = [ref for ref in _SPARED if ref() is not None]  # (trainers that are gone)
    _SPARED.append(weakref.WeakMethod(tensors))  # type: ignore[arg-type]


def _free_inherited_tensors(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: in a forked worker, drop the storage of every registered CPU tensor (the
    parent's are untouched: they are its own pages), then give the freed heap pages back to the system."""
    freed = 0
    for ref in _SPARED:
        source = ref()
        if source is None:
            continue
        for t in source():
            if t.device.type != "cpu" or type(t.data) is not torch.Tensor or t.numel() == 0:
                continue  # CUDA must not be touched in a forked process; DTensors (FSDP) keep their own layout
            if t.is_leaf and t.grad is not None:
                t.grad = None
            t.data = t.new_empty(0)
            freed += 1
    if freed:
        libc = ctypes.util.find_library("c")
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
        if trim is not None:  # glibc: tensors below the mmap threshold were freed into the heap
            trim(0)


class _EpochBatches:
    """The batch sampler of a DataLoader kept across epochs: each epoch sets its batches, and the DataLoader's
    persistent workers read them (the sampler runs in this process, so the workers need nothing new)."""

    def __init__(self) -> None:
        self.batches: Sequence[Sequence[int]] = []

    def __iter__(self) -> Iterator[Sequence[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _init_data_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: leave SIGTERM and SIGINT to the main process, which stops training with a
    checkpoint (a worker that died of a SIGTERM sent to the process group crashed the run), then free the
    inherited tensors."""
    ignore_stop_signals()
    _free_inherited_tensors(worker_id)


class _WorkersLoader(torch.utils.data.DataLoader):
    """A DataLoader that forks its workers with SIGTERM and SIGINT held back (they inherit the block until
    `_init_data_worker` ignores the signals: none dies of one in between)."""

    def _get_iterator(self) -> Any:
        with stop_signals_held():
            return super()._get_iterator()


class DataWorkers:
    """A DataLoader over `dataset` whose persistent worker processes serve every epoch of an iterator (started
    at the first epoch, stopped by `shutdown`). The workers ignore SIGTERM and SIGINT (the main process acts
    on them); where the DataLoader would end a worker that does not stop with SIGTERM, it sends SIGKILL."""

    def __init__(self, dataset: Any, collate_fn: Callable, num_workers: int):
        self.batches = _EpochBatches()
        self.loader = _WorkersLoader(
            dataset,
            collate_fn=collate_fn,
            batch_sampler=self.batches,
            num_workers=num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=True,
            worker_init_fn=_init_data_worker,
            multiprocessing_context=child_context(),
        )

    def serve(self, batches: Sequence[Sequence[int]]) -> torch.utils.data.DataLoader:
        """The DataLoader, set to read `batches` (a new iter() restarts the workers' queue; after `shutdown`
        it forks new workers)."""
        workers = self.loader._iterator
        if workers is not None and workers._shutdown:
            self.loader._iterator = None
        self.batches.batches = batches
        return self.loader

    def shutdown(self) -> None:
        """Stop the worker processes (the iterator that ran them stays referenced until `serve` replaces it,
        so its queues' feeder threads finish before the queues are freed)."""
        workers = self.loader._iterator  # the persistent workers' iterator (None before they start)
        if workers is not None:
            workers._shutdown_workers()


class _CollatingIterable:
    """Reads and collates batches in this process (num_workers=0): no DataLoader overhead, no pickling; batches
    are pinned when CUDA is available."""

    def __init__(self, dataset: Any, collate_fn: Callable, batches: Sequence[Sequence[int]]):
        self.dataset, self.collate_fn, self.batches = dataset, collate_fn, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        pin = torch.cuda.is_available()
        for batch in self.batches:
            collated = self.collate_fn([self.dataset[int(i)] for i in batch])
            yield pinned(collated) if pin else collated


def shard(batches: Sequence, num_shards: int, shard_id: int, fill_value: Any = ()) -> list:
    """Batches shard_id, shard_id + num_shards, ...; padded with `fill_value` to ceil(len / num_shards)."""
    mine = list(batches[shard_id::num_shards])
    want = math.ceil(len(batches) / num_shards)
    return mine + [fill_value] * (want - len(mine))


class EpochBatchIterator:
    """Iterates over `batch_sampler` (a list of index arrays) epoch after epoch; resumable mid-epoch.

    Usage: `itr = ebi.next_epoch_itr(shuffle=True)`; `for batch in itr: ...`; `ebi.state_dict()` at any point;
    a fresh EpochBatchIterator built on the same batches, after `load_state_dict`, continues at that point.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any],
        batch_sampler: Sequence[Sequence[int]],
        seed: int = 1,
        num_shards: int = 1,
        shard_id: int = 0,
        epoch: int = 1,
        buffer_size: int = 0,
        num_workers: int = 0,
    ):
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id {shard_id} is not in [0, {num_shards})")
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.frozen_batches = tuple(np.asarray(b, dtype=np.int64) for b in batch_sampler)
        self.seed = seed
        self.num_shards = num_shards
        self.shard_id = shard_id
        self.buffer_size = buffer_size
        self.num_workers = num_workers
        self.epoch = epoch
        self.shuffle = True
        self.fix_batches_to_gpus = False
        self._cur_epoch_itr: CountingIterator | None = None
        self._next_epoch_itr: CountingIterator | None = None
        # with workers: one DataLoader for every epoch, its workers kept (started once, not per epoch)
        self._workers: DataWorkers | None = None
        self._background: _BackgroundIterator | None = None

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return math.ceil(len(self.frozen_batches) / self.num_shards)

    @property
    def first_batch(self) -> Any:
        """A real collated batch, for dummy steps (a rank with an empty batch still runs forward/backward)."""
        if not self.frozen_batches:
            return {}
        return self.collate_fn([self.dataset[int(i)] for i in self.frozen_batches[0]])

    @property
    def next_epoch_idx(self) -> int:
        """The epoch that the next call to `next_epoch_itr` will iterate over."""
        if self._next_epoch_itr is not None:
            return self.epoch
        if self._cur_epoch_itr is not None and self.end_of_epoch():
            return self.epoch + 1
        return self.epoch

    @property
    def iterations_in_epoch(self) -> int:
        """Batches already yielded (or skipped by a resume) in the current epoch."""
        if self._cur_epoch_itr is not None:
            return self._cur_epoch_itr.n
        if self._next_epoch_itr is not None:
            return self._next_epoch_itr.n
        return 0

    def next_epoch_itr(self, shuffle: bool = True, fix_batches_to_gpus: bool = False) -> CountingIterator:
        """Iterator over the next epoch's batches (or the rest of the epoch restored by load_state_dict).

        `fix_batches_to_gpus`: shard first, then shuffle within the shard, so each rank sees the same examples
        every epoch (only the order changes).
        """
        self.epoch = self.next_epoch_idx
        if self._next_epoch_itr is not None:
            self._cur_epoch_itr, self._next_epoch_itr = self._next_epoch_itr, None
        else:
            self.shuffle, self.fix_batches_to_gpus = shuffle, fix_batches_to_gpus
            self._cur_epoch_itr = self._iterator_for_epoch(self.epoch, shuffle, fix_batches_to_gpus)
        return self._cur_epoch_itr

    def end_of_epoch(self) -> bool:
        return self._cur_epoch_itr is not None and not self._cur_epoch_itr.has_next()

    def state_dict(self) -> dict[str, Any]:
        if self.end_of_epoch():
            # A finished epoch resumes at the start of the next one.
            state = {"epoch": self.epoch + 1, "iterations_in_epoch": 0, "shuffle": self.shuffle}
        else:
            state = {
                "epoch": self.epoch,
                "iterations_in_epoch": self.iterations_in_epoch,
                "shuffle": self.shuffle,
            }
        if self.fix_batches_to_gpus:  # only written when used, so the state stays fairseq's three keys
            state["fix_batches_to_gpus"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by `state_dict` (also accepts fairseq's `train_iterator` state)."""
        self.epoch = int(state["epoch"])
        self.shuffle = bool(state.get("shuffle", True))
        self.fix_batches_to_gpus = bool(state.get("fix_batches_to_gpus", False))
        self._cur_epoch_itr = None
        offset = int(state.get("iterations_in_epoch", 0))
        if offset <= 0:
            self._next_epoch_itr = None
            return
        if offset >= len(self):
            raise SeqtrainError(
                f"cannot resume the data iterator at batch {offset} of epoch {self.epoch}: this epoch has only "
                f"{len(self)} batches; the data or batching flags (--max-tokens, --batch-size, "
                f"--required-batch-size-multiple, world size) changed since the checkpoint"
            )
        self._next_epoch_itr = self._iterator_for_epoch(
            self.epoch, self.shuffle, self.fix_batches_to_gpus, offset
        )

    def epoch_batches(self, epoch: int, shuffle: bool = True, fix_batches_to_gpus: bool = False) -> list:
        """This rank's batches of `epoch` (index arrays, `[]` for filler), in the order it trains them."""
        batches = list(self.frozen_batches)
        if shuffle and not fix_batches_to_gpus:
            # Legacy RandomState: the same permutation as fairseq's `numpy_seed(seed + epoch)` + np.random.shuffle.
            np.random.RandomState(self.seed + epoch).shuffle(batches)
        batches = shard(batches, self.num_shards, self.shard_id, fill_value=[])
        if shuffle and fix_batches_to_gpus:
            np.random.RandomState(self.seed + epoch + self.shard_id).shuffle(batches)
        return batches

    def _iterator_for_epoch(
        self, epoch: int, shuffle: bool, fix_batches_to_gpus: bool, offset: int = 0
    ) -> CountingIterator:
        batches = self.epoch_batches(epoch, shuffle, fix_batches_to_gpus)[offset:]
        if self._background is not None:  # nothing reads the previous epoch any more
            self._background.close()
            self._background = None
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if set_epoch is not None:  # a dataset whose items depend on the epoch (the denoising noise)
            set_epoch(epoch)
        if self.num_workers > 0:
            if self._workers is None:
                self._workers = DataWorkers(self.dataset, self.collate_fn, self.num_workers)
            # The epoch's batches (after a resume: the rest of them)
            itr: Iterable = self._workers.serve(batches)
        else:
            itr = _CollatingIterable(self.dataset, self.collate_fn, batches)
        if self.buffer_size > 0:
            itr = self._background = _BackgroundIterator(itr, self.buffer_size)
        return CountingIterator(itr, start=offset, total=offset + len(batches))

    def close(self) -> None:
        """Stop this iterator's helpers: the background thread (`buffer_size`) and the DataLoader's persistent
        worker processes (`num_workers`). A run calls it as it ends, so nothing still reads data while the
        process group is torn down and the interpreter exits. The position (`state_dict`) is kept; the epoch in
        progress cannot be iterated further, a new `next_epoch_itr` starts the helpers anew."""
        if self._background is not None:
            self._background.close()
            self._background = None
        if self._workers is not None:
            self._workers.shutdown()
