#!/usr/bin/env python
"""Host time of a training step: seqtrain against transformers, side by side in one process, on the CPU.

A BART training step on a GPU at CNN/DM micro-batch sizes is host-bound (scripts/gpu/gpu_check.sh's profile stage:
on an H200, bart_large at ~16k tokens a step keeps the device busy ~105 ms of a 166-187 ms step): Python and
the dispatcher launching ~3,100 kernels set the pace, not the kernels. This script measures that host time
where it can be measured without a GPU: a model with bart_large's depth (12 + 12 layers) and a tiny width (32),
tiny batches, one thread, so the arithmetic is negligible and a step's time is its host overhead. Rows:

  seqtrain             Trainer.train_step as seqtrain-train runs it (this tree)
  seqtrain, nested     the same with the FFN's activation derivative through a nested torch.autograd.grad and
                       train() on every step (what the tree did before they were removed)
  transformers         BartForConditionalGeneration with the same weights: forward, backward, fused AdamW step
                       (as in the GPU check)

Rounds alternate the variants; the figure is the median ms per step over rounds. Beside it, the aten operators
each variant dispatches in one step (counted once, with a TorchDispatchMode: forward, backward and the update;
on a GPU each costs host time and all but the views launch a kernel). With --bf16, seqtrain's Trainer runs
`--bf16` and transformers' forward runs under bf16 autocast, as the GPU check's training stage runs them (a
CPU without bf16 arithmetic emulates the matrix products, so there the times include arithmetic; the operator
counts are what carries over to a GPU).

With --generate, the same for beam search (the GPU check's generate stage is host-bound too: ~300 sentences/s
of bart_base on an H200, a few milliseconds a decoding step): bart_base's depth (6 + 6 layers) at width 32,
peaked random weights shared by both toolkits (scripts/bench/bench_generate.py), batches of 32 random sources of
20-30 tokens (short, so that the encoder and cross-attention arithmetic stay negligible: on a GPU the host
time of a decoding step does not depend on the source length; --source-tokens 400,700 is the GPU check's
length), beam 4, CNN/DM's search settings (lenpen 2, no-repeat-ngram 3, min length 5, max length 60).
Rows: seqtrain's SequenceGenerator and transformers' `generate`, ms per batch, and the aten operators each
dispatches per batch (counted once, with a TorchDispatchMode): on a GPU each one costs host time, and all but
the views launch a kernel. The best hypotheses of the two are compared (identical weights, fp32).

    .venv/bin/python scripts/bench/bench_host_overhead.py            # about a minute
    .venv/bin/python scripts/bench/bench_host_overhead.py --generate # about two minutes
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))

import gpu_check_lib as lib  # noqa: E402  (scripts/gpu/gpu_check_lib.py)

from seqtrain.models import transformer  # noqa: E402

VOCAB = 1000
NARROW = [
    "--encoder-layers", "12", "--decoder-layers", "12",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]  # fmt: skip


class _Nested:
    """seqtrain as it was: no direct activation derivatives (the FFN's backward runs a nested autograd pass)."""

    def __enter__(self) -> None:
        self.saved = transformer._ACTIVATION_GRADS
        transformer._ACTIVATION_GRADS = {}

    def __exit__(self, *exc: object) -> None:
        transformer._ACTIVATION_GRADS = self.saved


class _OpCount(TorchDispatchMode):
    """Counts the aten operators dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _alternate(variants: dict, rounds: int, per: int) -> dict[str, list[float]]:
    """ms per unit (`per` units a call) of each variant, a list over rounds; the order flips every round."""
    for fn in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            start = time.perf_counter()
            variants[name]()
            times[name].append(1000 * (time.perf_counter() - start) / per)
    return times


def _print_table(
    title: str, unit: str, times: dict[str, list[float]], extra: dict[str, dict[str, str]] | None = None
) -> None:
    """The title (with the load average) and one row per variant: median and min ms per `unit`, the `extra`
    columns (column -> variant -> text), the median against transformers'."""
    extra = extra or {}
    ref = statistics.median(times["transformers"])
    print(f"{title}; load {os.getloadavg()[0]:.1f}")
    heads = [f"ms/{unit} (median)", "min", *extra, "vs transformers"]
    print(f"| variant | {' | '.join(heads)} |")
    print("|---" * (len(heads) + 1) + "|")
    for name, ts in times.items():
        med = statistics.median(ts)
        cells = [f"{med:.1f}", f"{min(ts):.1f}", *(col[name] for col in extra.values()), f"{med / ref:.2f}x"]
        print(f"| {name} | {' | '.join(cells)} |")


def generate_main(args: argparse.Namespace) -> int:
    import bench_generate as bg

    from seqtrain.data.dictionary import Dictionary

    vocab = VOCAB
    hf, ours = bg.load_pair(
        bg.peaked_random_state(vocab, seed=0, eos_scale=3.0, shape="narrow"), vocab, "narrow"
    )
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    n = args.batches * args.batch_size
    lo, hi = (int(x) for x in args.source_tokens.split(","))
    sources = [s.tolist() for s, _ in lib.make_pairs(n, (lo, hi), (2, 3), vocab, seed=11)]
    batches = [sources[i : i + args.batch_size] for i in range(0, n, args.batch_size)]
    s = bg.Settings(beam=4, lenpen=2.0, no_repeat_ngram_size=3, min_len=5, max_len_b=60)
    decoders = {
        "seqtrain": lambda b: bg.seqtrain_decode(ours, b, s, d),
        "transformers": lambda b: bg.hf_decode(hf, b, s),
    }
    ops, hyps = {}, {}
    with torch.inference_mode():
        for name, decode in decoders.items():
            with _OpCount() as count:
                hyps[name] = [h for b in batches for h in decode(b)]
            ops[name] = sum(count.ops.values()) / len(batches)
        variants = {k: (lambda f=f: [f(b) for b in batches]) for k, f in decoders.items()}
        times = _alternate(variants, args.rounds, len(batches))
    same = sum(a == b for a, b in zip(hyps["seqtrain"], hyps["transformers"], strict=True))
    tokens = sum(len(h) for h in hyps["seqtrain"]) / n
    _print_table(
        f"host time of beam search, 6+6 layers of width 32, {args.batches} batches of {args.batch_size} sources "
        f"of {lo}-{hi} tokens, beam 4, {tokens:.1f} tokens a best hypothesis; best hypotheses identical: "
        f"{same}/{n}",
        "batch",
        times,
        {"aten ops/batch": {k: f"{v:.0f}" for k, v in ops.items()}},
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--generate", action="store_true", help="beam search instead of training steps")
    p.add_argument("--bf16", action="store_true", help="training steps under bf16 autocast (seqtrain --bf16)")
    p.add_argument("--batches", type=int, default=2, help="--generate: batches per variant and round")
    p.add_argument("--batch-size", type=int, default=32, help="--generate: sources a batch")
    p.add_argument("--source-tokens", default="20,30", help="--generate: MIN,MAX tokens of a source")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.generate:
        return generate_main(args)
    trainer, _ = lib.make_trainer(True, "bart_tiny", VOCAB, "bf16" if args.bf16 else None, *NARROW)
    state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
    hf = lib.hf_model(argparse.Namespace(**trainer.run_args), state, VOCAB).train()
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8, fused=True)
    pairs = [lib.make_pairs(4, (20, 30), (5, 8), VOCAB, seed=i) for i in range(args.steps)]
    samples = [lib.seqtrain_sample(p) for p in pairs]
    hf_batches = [lib.hf_batch(p, torch.device("cpu")) for p in pairs]

    def seqtrain_steps() -> None:
        for s in samples:
            trainer.train_step([s])

    def nested_step(s: dict) -> None:
        with _Nested():
            trainer.model.train()  # the old Trainer.train_step and task.train_step each walked the
            trainer.model.train()  # modules on every step
            trainer.train_step([s])

    def nested_steps() -> None:
        for s in samples:
            nested_step(s)

    def hf_step(b: dict[str, torch.Tensor]) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = hf(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.detach())

    def hf_steps() -> None:
        for b in hf_batches:
            hf_step(b)

    variants = {"seqtrain": seqtrain_steps, "seqtrain, nested": nested_steps, "transformers": hf_steps}
    times = _alternate(variants, args.rounds, args.steps)  # warms every variant up first
    one_step = {
        "seqtrain": lambda: trainer.train_step([samples[0]]),
        "seqtrain, nested": lambda: nested_step(samples[0]),
        "transformers": lambda: hf_step(hf_batches[0]),
    }
    ops = {}
    for name, step in one_step.items():
        with _OpCount() as count:
            step()
        ops[name] = f"{sum(count.ops.values())}"
    precision = "bf16 autocast" if args.bf16 else "fp32"
    _print_table(
        f"host time of a training step, 12+12 layers of width 32, batch 4 x ~25 tokens, {precision}",
        "step",
        times,
        {"aten ops/step": ops},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
