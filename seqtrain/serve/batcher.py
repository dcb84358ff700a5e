"""The request queue and the one worker thread that batches texts across requests and generates them.

A request's texts are tokenized as they arrive (seqtrain.generation.runner.encode) and wait in one bounded queue
(--max-queue texts: a request that does not fit is refused at once, never kept in an unbounded backlog). The
worker takes the oldest text and, unless a full batch is already there, waits for company while texts keep
arriving less than --max-wait-ms apart (10 x --max-wait-ms at most; not at all when no request came alongside
another for COMPANY_S: a lone client's text runs at once), then forms a batch around it from the texts
whose search settings agree (every setting but nbest, which only cuts the returned list): length-sorted, its
neighbours in length added while the batch holds at most --max-batch-tokens padded source tokens and
--max-batch-size texts. The batch goes through the path
seqtrain-generate takes (runner.text_dataset, its collater, runner.run_batches with the model's forced first
token, runner.decode), so a text gets seqtrain-generate's summary for the same settings, whatever it was batched
with: a hypothesis does not depend on its batch neighbours (fp32 and bf16; --compute-type int8 quantizes
activations per batch, as it does in seqtrain-generate at another --batch-size).

An exception in a batch fails that batch's requests (500) and the worker goes on. A request that is cancelled
(its client went away, its time ran out) leaves the queue; a batch already running finishes and its answer is
dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seqtrain.generation import runner
from seqtrain.generation.search import GenerationConfig
from seqtrain.generation.sequence_generator import build_generator
from seqtrain.serve.metrics import Metrics
from seqtrain.serve.requests import ApiError

logger = logging.getLogger("seqtrain.serve")

WAIT_SPAN = 10  # an idle worker waits at most this many --max-wait-ms for a batch to gather
# a text is batched at once, without waiting for company, when no request came alongside another this long
COMPANY_S = 1.0
GENERATORS_KEPT = 16  # generators built for distinct settings (static decoding keeps its CUDA graphs in one)


def search_key(config: GenerationConfig) -> tuple:
    """What must agree for two texts to share a batch: every search setting but nbest."""
    return tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name != "nbest")


class Answer:
    """One request's texts on their way: the results fill in as batches finish; `future` (on the event loop
    `loop`) resolves with the list of results, or with an ApiError."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop):
        self.results: list[dict[str, Any] | None] = [None] * n
        self.remaining = n
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.closed = False  # answered, failed or cancelled: nothing more to do for it

    def _settle(self, value: Any, error: bool) -> None:
        def settle() -> None:
            if not self.future.done():
                (self.future.set_exception if error else self.future.set_result)(value)

        self.loop.call_soon_threadsafe(settle)


@dataclass(eq=False)  # identity: two texts are never the same item
class Item:
    answer: Answer | None  # None: the warm-up's text
    index: int  # the text's place in its request
    source: torch.Tensor  # token ids with </s>
    length: int  # source tokens as generated (after truncation to the model's positions)
    key: tuple
    config: GenerationConfig
    arrived: float = field(default_factory=time.monotonic)


def take_batch(queue: list[Item], max_tokens: int, max_size: int) -> tuple[list[Item], list[Item]]:
    """The batch around the oldest text of `queue` (arrival order) and the texts left: texts of its settings,
    sorted by length, its nearest neighbours in length added while the batch holds at most `max_size` texts and
    `max_tokens` padded source tokens (the oldest always goes, alone if it must)."""
    oldest = queue[0]
    same = sorted((it for it in queue if it.key == oldest.key), key=lambda it: it.length)
    at = next(i for i, it in enumerate(same) if it is oldest)
    lo, hi, width = at, at + 1, oldest.length

    def fits(it: Item) -> bool:
        n = hi - lo + 1
        return n <= max_size and n * max(width, it.length) <= max_tokens

    while True:
        left = same[lo - 1] if lo > 0 and fits(same[lo - 1]) else None
        right = same[hi] if hi < len(same) and fits(same[hi]) else None
        if left is None and right is None:
            break
        if right is None or (left is not None and width - left.length <= right.length - width):
            lo -= 1
        else:
            hi += 1
            width = max(width, right.length)
    batch = same[lo:hi]
    taken = {id(it) for it in batch}
    return batch, [it for it in queue if id(it) not in taken]


class Batcher:
    def __init__(
        self,
        loaded: runner.GenerationModel,
        metrics: Metrics,
        max_batch_tokens: int,
        max_batch_size: int,
        max_wait_s: float,
        max_queue: int,
    ):
        self.loaded, self.metrics = loaded, metrics
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size
        self.max_wait_s, self.max_queue = max_wait_s, max_queue
        # the longest source kept whole; seqtrain-generate cuts longer ones to it (its dataset's rule)
        self.max_source = runner.text_dataset(loaded, []).source_limit
        self._cond = threading.Condition()
        self._queue: list[Item] = []  # arrival order
        self._generators: OrderedDict[tuple, Any] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.running = 0  # texts in the batch being generated
        self.arriving = 0  # requests received, not yet queued (their bodies read, checked, tokenized)
        self._company_at = -math.inf  # when a request last arrived while another was in the server

    # ------------------------------------------------------------------------------------------ the front
    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        """Around a request's reception up to submit(): the worker waits for it to batch it with others."""
        with self._cond:
            if self.arriving or self._queue or self.running:
                self._company_at = time.monotonic()
            self.arriving += 1
        try:
            yield
        finally:
            with self._cond:
                self.arriving -= 1
                self._cond.notify()

    def encode(self, texts: list[str]) -> list[torch.Tensor]:
        return runner.encode(self.loaded, texts)

    def submit(self, answer: Answer, sources: list[torch.Tensor], config: GenerationConfig) -> None:
        """Queue a request's texts, or refuse them all with 503 when the queue cannot hold them."""
        key = search_key(config)
        items = [Item(answer, i, s, min(len(s), self.max_source), key, config) for i, s in enumerate(sources)]
        with self._cond:
            if self._stopping:
                raise ApiError(503, "shutting_down", "the server is shutting down", {"Retry-After": "1"})
            if len(self._queue) + len(items) > self.max_queue:
                wait = self.retry_after(len(self._queue) + len(items))
                raise ApiError(
                    503,
                    "queue_full",
                    f"the queue is full ({len(self._queue)} of --max-queue {self.max_queue} texts waiting); "
                    f"retry in {wait} s",
                    {"Retry-After": str(wait)},
                )
            self._queue.extend(items)
            self._cond.notify()

    def retry_after(self, texts: int) -> int:
        """Seconds until `texts` queued texts are likely done, at the recent rate (1 to 60)."""
        rate = self.metrics.rate()
        return 1 if rate <= 0 else int(min(60, max(1, math.ceil(texts / rate))))

    def cancel(self, answer: Answer) -> None:
        """The request's texts leave the queue; a batch holding some finishes and drops their answers."""
        with self._cond:
            answer.closed = True
            self._queue = [it for it in self._queue if it.answer is not answer]

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    # ------------------------------------------------------------------------------------------ the worker
    def start(self, warmup: GenerationConfig) -> None:
        """Generate once (the first batch pays for lazy initialization: kernels, CUDA graphs), then start the
        worker."""
        source = self.encode(["warm up"])[0]
        self.generate_batch([Item(None, 0, source, len(source), search_key(warmup), warmup)])
        self._thread = threading.Thread(target=self._work, name="seqtrain-serve-batcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Answer what is queued, then end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                while self._queue and not self._stopping and not self._full(self._queue[0]):
                    left = self._deadline() - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._take() if self._queue else []
                self.running = len(batch)
            if batch:
                self._run(batch)  # (it sets running back to 0 once the batch is generated)

    def _deadline(self) -> float:
        """When to stop waiting for company: --max-wait-ms after the latest arrival (texts that keep coming
        closer together than that are waited for: closed-loop clients whose answers went out together come back
        over a few milliseconds), or while requests are being received and tokenized; never later than
        WAIT_SPAN x --max-wait-ms after the oldest. Now, when no request arrived while another was in the server
        for COMPANY_S: one client at a time (or requests far apart) would only wait."""
        if not self.arriving and time.monotonic() - self._company_at > COMPANY_S:
            return time.monotonic()
        oldest, newest = self._queue[0].arrived, self._queue[-1].arrived
        cap = oldest + WAIT_SPAN * self.max_wait_s
        return cap if self.arriving else min(cap, newest + self.max_wait_s)

    def _full(self, oldest: Item) -> bool:
        """Whether the texts that could join the oldest already make a full batch."""
        same = [it for it in self._queue if it.key == oldest.key]
        width = max(it.length for it in same)
        return len(same) >= self.max_batch_size or len(same) * width >= self.max_batch_tokens

    def _take(self) -> list[Item]:
        batch, self._queue = take_batch(self._queue, self.max_batch_tokens, self.max_batch_size)
        return batch

    def _run(self, batch: list[Item]) -> None:
        try:
            results = self.generate_batch(batch)
        except Exception as e:  # this batch's requests fail; the worker and every other request go on
            self._ran()
            logger.exception(f"a batch of {len(batch)} texts failed")
            self.metrics.batch(len(batch), 0, ok=False)
            error = ApiError(500, "generation_failed", f"generation failed: {type(e).__name__}: {e}")
            for answer in {id(it.answer): it.answer for it in batch if it.answer is not None}.values():
                self.cancel(answer)
                answer._settle(error, error=True)
            return
        self._ran()
        self.metrics.batch(len(batch), sum(h["tokens"] for r in results for h in r["hypotheses"]), ok=True)
        for it, result in zip(batch, results):
            answer = it.answer
            if answer is None or answer.closed:
                continue
            answer.results[it.index] = result
            answer.remaining -= 1
            if answer.remaining == 0:
                answer.closed = True
                answer._settle(answer.results, error=False)

    def _ran(self) -> None:
        """The batch is generated: no longer running before its answers go out (a client's next request, sent
        when its answer came, does not find its own last batch still running, as company)."""
        with self._cond:
            self.running = 0

    def generate_batch(self, batch: list[Item]) -> list[dict[str, Any]]:
        """One batch through seqtrain-generate's path; per item its nbest hypotheses (text, base-2 score as
        seqtrain-generate's H-/D- lines print it, tokens with the final </s>) and its source length."""
        loaded, config = self.loaded, batch[0].config
        generator = self._generator(batch[0].key, config)
        ds = runner.text_dataset(loaded, [it.source for it in batch])
        hypos: dict[int, list[dict[str, Any]]] = {}
        for sid, _, _, hyps in runner.run_batches(loaded, generator, ds, [np.arange(len(batch))]):
            hypos[sid] = hyps
        out = []
        for i, it in enumerate(batch):
            best = hypos[i][: it.config.nbest]
            out.append(
                {
                    "hypotheses": [
                        {
                            "summary": runner.decode(loaded, h["tokens"]),
                            "score": float(h["score"]) / math.log(2),
                            "tokens": len(h["tokens"]),
                        }
                        for h in best
                    ],
                    "source_tokens": len(it.source),
                    "truncated": len(it.source) > self.max_source,
                }
            )
        return out

    def _generator(self, key: tuple, config: GenerationConfig) -> Any:
        """The generator for these settings (kept for the next batches; it returns every finished hypothesis,
        each text keeps its own nbest)."""
        gen = self._generators.get(key)
        if gen is None:
            loaded = self.loaded
            every = dataclasses.replace(config, nbest=config.beam)
            gen = build_generator(loaded.model, loaded.lm.tgt_dict, every, bos=loaded.start, eos=loaded.end)
            self._generators[key] = gen
            if len(self._generators) > GENERATORS_KEPT:
                self._generators.popitem(last=False)
        self._generators.move_to_end(key)
        return gen
