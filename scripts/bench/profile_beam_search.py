#!/usr/bin/env python
"""Where beam search spends its time on the CPU: torch.profiler over seqtrain's SequenceGenerator, split by part.

The model has the quickstart's shape (configs/debdesc_small.yaml: bart_small, d 256, 3+3 pre-norm layers, 4
heads, FFN 1024, 8,008 symbols) with bench_generate's peaked random weights (--eos-scale 2.6: best hypotheses
of 5-30 tokens, median 15, like the quickstart's one-line synopses); batches of --batch random sources of
--src-len tokens; the quickstart's search (beam 4, lenpen 1, max-len-b 30, no-repeat-ngram 3); one thread by
default. The library is not changed: this script wraps the functions that make up a step in
`torch.profiler.record_function` ranges (the encoder, all of it; the decoder's self-attention, cross-attention,
FFN and output projection; the cache reorder; log_softmax and masks; n-gram blocking; the strategy's
candidates; the beams' continuation; finalization) and attributes every aten operator's own time to the
innermost range around it. Per range: its own time (ranges inside it excluded), the aten operators' time in
it, and the rest (Python, the dispatcher, the profiler's own cost). A second table sums the aten operators by
kind. Range times are wall clock: on a loaded machine they include waits for a core, spread over every part.

The profiler costs a few microseconds per operator and range, which inflates the Python share: the first line
gives the unprofiled CPU time per batch beside the profiled one.

    PYTHONPATH=. python scripts/bench/profile_beam_search.py               # eager loop, 2 batches of 32
    PYTHONPATH=. python scripts/bench/profile_beam_search.py --static      # the static loop (--static-decoding)
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))

import bench_generate as bg  # noqa: E402
from bench_packing import git_commit  # noqa: E402

from seqtrain.data.dictionary import Dictionary  # noqa: E402
from seqtrain.generation import decode_step, device_finalize, sequence_generator, static_decoding  # noqa: E402
from seqtrain.generation.ngram import NGramRepeatBlocker  # noqa: E402
from seqtrain.models import bart, transformer  # noqa: E402

PREFIX = "bs:"  # the ranges this script adds

# (owner, attribute, range name): what each range wraps
RANGES = [
    (sequence_generator.SequenceGenerator, "_generate", "generate (loop body: the rest)"),
    (bart.BartEncoder, "forward", "encoder"),
    (bart.BartDecoder, "forward", "decoder (embeddings, layer norms, residuals)"),
    (transformer.MultiheadAttention, "self_attention", "decoder self-attention (qkv, cache, sdpa, out)"),
    (transformer.MultiheadAttention, "cross_attention", "decoder cross-attention (q, sdpa, out)"),
    (transformer._FeedForward, "_ffn", "decoder FFN"),
    (bart.BartDecoder, "output_layer", "decoder output projection (d x vocab)"),
    (bart.BartDecoder, "reorder_incremental_state", "cache reorder (beams, finished sentences)"),
    (bart.BartEncoder, "reorder_encoder_out", "cache reorder (beams, finished sentences)"),
    (decode_step.DecodeStep, "log_probs", "log_softmax and masks"),
    (NGramRepeatBlocker, "__call__", "n-gram blocking"),
    (decode_step.DecodeStep, "candidates", "candidates (topk over beam x vocab)"),
    (decode_step.DecodeStep, "advance", "continue beams (gather rows)"),
    (sequence_generator.SequenceGenerator, "_finalize", "finalize hypotheses + collect"),
    (sequence_generator.SequenceGenerator, "_collect", "finalize hypotheses + collect"),
    # the static loop's decoder step and finalization (--static)
    (static_decoding.StaticStep, "__call__", "decoder (embeddings, layer norms, residuals)"),
    (static_decoding.StaticStep, "_self_attn", "decoder self-attention (qkv, cache, sdpa, out)"),
    (static_decoding.StaticStep, "_cross_attn", "decoder cross-attention (q, sdpa, out)"),
    (static_decoding.StaticDecoder, "compact", "cache reorder (beams, finished sentences)"),
    (device_finalize.DeviceFinalizer, "add", "finalize hypotheses + collect"),
    (device_finalize.DeviceFinalizer, "collect", "finalize hypotheses + collect"),
]

KINDS = {  # aten operator (without its namespace and leading/trailing underscores) -> kind
    "matrix products": "addmm mm bmm baddbmm linear matmul",
    "attention kernel (sdpa)": "scaled_dot_product_flash_attention_for_cpu scaled_dot_product_attention "
    "scaled_dot_product_attention_math",
    "log_softmax": "log_softmax",
    "topk": "topk sort",
    "gathers and scatters": "index_select gather scatter index_copy index_put index take masked_fill nan_to_num",
    "pointwise and layer norm": "native_layer_norm layer_norm gelu relu add mul div sub where eq ne ge gt lt le "
    "logical_not bitwise_not bitwise_and bitwise_or floor_divide remainder neg all any sum cumsum clamp",
    "copies and fills": "copy cat clone contiguous repeat repeat_interleave fill zeros full empty empty_like "
    "zeros_like full_like ones arange to",
    "views (no arithmetic)": "view as_strided transpose permute reshape unsqueeze squeeze slice select t unbind "
    "split alias detach unsafe_view unfold narrow expand",
}
_KIND_OF = {name: kind for kind, names in KINDS.items() for name in names.split()}


_in_encoder = [False]  # the encoder's layers share the decoder's modules: inside it, one range only


def _wrap(owner: Any, attr: str, name: str) -> None:
    fn = owner.__dict__[attr]
    static = isinstance(fn, staticmethod)
    inner = fn.__func__ if static else fn
    encoder = name == "encoder"

    @functools.wraps(inner)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _in_encoder[0]:
            return inner(*args, **kwargs)
        _in_encoder[0] = encoder
        try:
            with record_function(PREFIX + name):
                return inner(*args, **kwargs)
        finally:
            _in_encoder[0] = False

    setattr(owner, attr, staticmethod(wrapped) if static else wrapped)


def _kind(op: str) -> str:
    return _KIND_OF.get(op.split("::")[-1].strip("_"), "other")


def build(args: argparse.Namespace) -> tuple[Any, list[torch.Tensor], Any]:
    vocab = 8008
    state = bg.peaked_random_state(vocab, seed=0, eos_scale=args.eos_scale, shape="small")
    cfg = bg.seqtrain_config(vocab, "small")
    cfg.encoder_normalize_before = cfg.decoder_normalize_before = True  # the quickstart's layout
    model = bart.BARTModel(cfg)
    model.load_state_dict(state, strict=False)
    model.eval()
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    g = torch.Generator().manual_seed(11)
    batches = [
        bg.pad_batch(
            [
                torch.randint(4, vocab, (args.src_len - 1,), generator=g).tolist() + [bg.EOS]
                for _ in range(args.batch)
            ],
            left=True,
        )
        for _ in range(args.batches)
    ]
    gen = sequence_generator.SequenceGenerator(
        model, d, beam_size=args.beam, nbest=1, max_len_b=args.max_len_b, no_repeat_ngram_size=args.ngram,
        static_decoding=args.static,
    )  # fmt: skip
    return model, batches, gen


def add_setup_args(p: argparse.ArgumentParser) -> list[str]:
    """The flags of build()'s model, batches and search (also bench_cpu_beam.py's); returns their dests."""
    actions = [
        p.add_argument("--batch", type=int, default=32),
        p.add_argument("--batches", type=int, default=2),
        p.add_argument("--src-len", type=int, default=48),
        p.add_argument("--beam", type=int, default=4),
        p.add_argument("--max-len-b", type=int, default=30),
        p.add_argument("--ngram", type=int, default=3),
        p.add_argument("--threads", type=int, default=1),
        p.add_argument(
            "--eos-scale",
            type=float,
            default=2.6,
            help="EOS embedding scale: 2.6 ends hypotheses at 5-30 tokens",
        ),
    ]
    return [a.dest for a in actions]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_args(p)
    p.add_argument("--static", action="store_true", help="profile the static loop (--static-decoding)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    _, batches, gen = build(args)

    with torch.inference_mode():
        gen.generate(batches[0][:4])  # warm-up
        c0 = time.process_time()
        lengths = sorted(len(h[0]["tokens"]) for b in batches for h in gen.generate(b))
        plain = (time.process_time() - c0) / len(batches)
        for owner, attr, name in RANGES:
            _wrap(owner, attr, name)
        gen.generate(batches[0][:4])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            c0 = time.process_time()
            for b in batches:
                gen.generate(b)
            profiled = (time.process_time() - c0) / len(batches)

    events = prof.events()
    incl: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    nested: dict[str, float] = defaultdict(float)  # time of ranges directly inside a range
    ops: dict[str, float] = defaultdict(float)
    kinds: dict[str, float] = defaultdict(float)
    op_names: dict[str, float] = defaultdict(float)

    def label_of(ev: Any) -> str | None:
        ev = ev.cpu_parent
        while ev is not None and not ev.name.startswith(PREFIX):
            ev = ev.cpu_parent
        return None if ev is None else ev.name[len(PREFIX) :]

    for ev in events:
        if ev.name.startswith(PREFIX):
            name = ev.name[len(PREFIX) :]
            incl[name] += ev.cpu_time_total
            calls[name] += 1
            outer = label_of(ev)
            if outer is not None:
                nested[outer] += ev.cpu_time_total
        elif ev.name.startswith("aten::"):
            where = label_of(ev) or "outside generate"
            ops[where] += ev.self_cpu_time_total
            kinds[_kind(ev.name)] += ev.self_cpu_time_total
            op_names[ev.name] += ev.self_cpu_time_total

    n = len(batches)
    total = incl["generate (loop body: the rest)"]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} thread(s); "
        f"torch {torch.__version__}; commit {git_commit()}; load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"bart_small shape (d 256, 3+3 pre-norm layers, vocab 8008), {'static' if args.static else 'eager'} loop, "
        f"batch {args.batch} x {args.src_len}-token sources, beam {args.beam}, max-len-b {args.max_len_b}, "
        f"no-repeat-ngram {args.ngram}; {n} batches; best hypotheses of {lengths[0]}-{lengths[-1]} tokens "
        f"(median {lengths[len(lengths) // 2]})"
    )
    # Range times are wall clock; on a shared machine the process also waits for a core. They are shown as
    # shares and as CPU milliseconds: the share times the profiled run's CPU time (waits spread evenly).
    cpu_ms = profiled * 1000 / (total / n)  # CPU milliseconds per wall microsecond of the profiled run
    print(
        f"CPU s per batch: {plain:.3f} unprofiled, {profiled:.3f} profiled (wall {total / 1e6 / n:.3f} s: "
        f"{total / 1e6 / n / profiled:.1f}x the CPU time on this machine's load)\n"
    )
    print("| part | calls/batch | share | ~CPU ms/batch | of which aten operators | Python + dispatch |")
    print("|---|---|---|---|---|---|")
    for name in sorted(incl, key=lambda k: incl[k] - nested[k], reverse=True):
        excl = (incl[name] - nested[name]) / n
        op = ops[name] / n
        print(
            f"| {name} | {calls[name] / n:.0f} | {100 * excl / (total / n):.1f}% | {excl * cpu_ms:.0f} | "
            f"{op * cpu_ms:.0f} | {(excl - op) * cpu_ms:.0f} |"
        )
    aten = sum(ops.values()) / n
    print(f"| total (generate) | | 100% | {profiled * 1000:.0f} | {aten * cpu_ms:.0f} | "
          f"{(total / n - aten) * cpu_ms:.0f} |\n")  # fmt: skip
    print("| aten operators by kind | share of generate | ~CPU ms/batch |")
    print("|---|---|---|")
    for kind, us in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {100 * us / total:.1f}% | {us / n * cpu_ms:.0f} |")
    other = sorted(((v, k) for k, v in op_names.items() if _kind(k) == "other"), reverse=True)[:6]
    print("\n'other' holds: " + ", ".join(f"{k.split('::')[-1]} {v / n * cpu_ms:.1f}" for v, k in other))
    print("top aten operators (~CPU ms/batch): " + ", ".join(
        f"{k.split('::')[-1]} {v / n * cpu_ms:.0f}" for k, v in sorted(op_names.items(), key=lambda kv: -kv[1])[:12]
    ))  # fmt: skip


if __name__ == "__main__":
    main()
