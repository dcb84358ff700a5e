"""The fair comparisons of the prepared GPU run (issue 49), stages of scripts/gpu/gpu_speed.py: seqtrain against
transformers at its best, in the same layout, with samples alternated in rounds (scripts/gpu/interleave.py).

train_fair_large, train_fair_base
    65,536 tokens an update (configs/bart_large_cnndm.yaml's 4 x 16,384), bf16, on the same updates and the same
    initial weights. seqtrain: the update merged into one pass (--merge-max-tokens) with --compile, and eager.
    transformers' BartForConditionalGeneration, fused AdamW, the SAME one pass (the update's pairs as one batch,
    no accumulated micro-batches): eager with cuDNN attention off (padded to the update's widest), compiled
    (torch.compile of the model; padded to 1,024 source and 128 target tokens, the batch dimension dynamic, so
    it compiles once) with cuDNN attention off and on, eager with cuDNN attention on (padded to the fixed widths:
    cuDNN builds a plan per shape), and attn_implementation="flex_attention" (its own model from the same
    initial weights; transformers compiles the kernel). Every engine warms up on the same updates; then
    `rounds` rounds, every engine once a round on that round's update, the order rotated. Per engine: ms per
    update (median, quartiles, min-max), tokens/s, MFU, the cuDNN switch it ran with, its preparation seconds;
    the fastest engine of each toolkit (least median) and seqtrain's speedup over transformers' best (ratio of
    medians, and the median, min and max of the per-round ratios); the step-0 losses (seqtrain against
    transformers, flex against SDPA, on the initial weights); seqtrain's compiled step at a second batch shape:
    graphs compiled there (target 0) and graph breaks; the top kernels of seqtrain's best (torch.profiler).
    Engines are prepared in order of importance while the stage's budget allows (what is left out is named).
generate_fair
    Beam search at bart_base shapes (gpu_check's generation setup: peaked random weights, 400-700-token sources,
    beam 4), in bf16 weights then fp32 (TF32 off): seqtrain's static decoding (CUDA graphs) and its eager loop
    against transformers' generate with its default dynamic cache, with cache_implementation="static", the
    same with cuDNN attention on (bf16: cuDNN is half precision only), and with the static cache and the model's
    forward compiled (torch.compile, mode "reduce-overhead": CUDA graphs; sources padded to one width, so it
    compiles once). Every engine decodes all the sentences once untimed (capture, compile, warm caches), then
    `gen_rounds` alternated timed passes: sentences/s from the median pass, spreads, the fastest of each
    toolkit, the speedup; best hypotheses identical to seqtrain's static path (fp32: all of transformers'
    default's must be).

On a CPU (--dry-run) everything runs at tiny shapes; transformers' compiled engines need `--dry-compile` (dynamo
traces transformers' BART for seconds a shape on a CPU; with the eager backend) and flex attention has no
backward on a CPU (its engine is skipped with that reason).
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import statistics
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import gpu_check
import gpu_check_lib as lib
import interleave as il
import torch

from seqtrain.data.pair_dataset import bucketed
from seqtrain.train.flops import Seq2SeqFlops

# (engine, toolkit, GPU seconds its preparation needs at bart_large: build, compile, warm-up), most important
# first: seqtrain's best, then transformers' settings from the likeliest best (2026-12-04: compiled, cuDNN off)
TRAIN_ENGINES = (
    ("seqtrain_compiled", "seqtrain", 30),
    ("hf_eager", "transformers", 12),
    ("hf_compiled", "transformers", 50),
    ("hf_compiled_cudnn", "transformers", 50),
    ("hf_eager_cudnn", "transformers", 10),
    ("hf_flex", "transformers", 60),
    ("seqtrain_eager", "seqtrain", 12),
)
TRAIN_LAYOUT = {
    "seqtrain_compiled": "one merged pass (--merge-max-tokens), --compile",
    "seqtrain_eager": "one merged pass (--merge-max-tokens), eager",
    "hf_eager": "one pass, padded to the update's widest, eager, cuDNN attention off",
    "hf_compiled": "one pass, padded to fixed widths, torch.compile, cuDNN attention off",
    "hf_compiled_cudnn": "one pass, padded to fixed widths, torch.compile, cuDNN attention on",
    "hf_eager_cudnn": "one pass, padded to fixed widths, eager, cuDNN attention on",
    "hf_flex": "one pass, padded to fixed widths, attn_implementation=flex_attention",
}
# (engine, GPU seconds its preparation needs: build, compile, the warm-up passes), most important first
GENERATE_ENGINES = (
    ("seqtrain_static", 10),
    ("hf_dynamic", 6),
    ("hf_static", 8),
    ("hf_compiled_static", 60),
    ("hf_static_cudnn", 8),
    ("seqtrain_eager", 6),
)


def _free(check: Any) -> None:
    gc.collect()
    gpu_check.reset_memory(check)


def _timer(check: Any) -> Callable[[Callable[[], Any]], float]:
    return lambda fn: gpu_check.timed(check, fn)[0]


def _cudnn(on: bool) -> Callable[[], None]:
    return lambda: torch.backends.cuda.enable_cudnn_sdp(on)


def _dynamo_counts() -> tuple[int, int, int]:
    """(frames compiled, graphs compiled, graph breaks) so far: a recompile shows in the first two (torch
    2.13 counts a fullgraph frame in unique_graphs only, so both are read)."""
    from torch._dynamo.utils import counters  # (torch._dynamo: only where a stage compiles)

    return (
        counters["frames"].get("ok", 0),
        counters["stats"].get("unique_graphs", 0),
        sum(counters["graph_break"].values()),
    )


def _compile_skip(check: Any, what: str) -> str | None:
    """Why a dry run leaves `what` out, or None."""
    if check.dry and not getattr(check, "dry_compile", False):
        return f"dry run: the GPU run compiles {what} (--dry-compile runs it here, with the eager backend)"
    return None


def _stats(out: dict[str, Any], prefix: str, seconds: list[float], unit_scale: float, unit: str) -> None:
    out.update(il.record(prefix, il.summary(seconds), unit, unit_scale))
    out[f"{prefix}_samples_s"] = seconds


def _choose(
    out: dict[str, Any], prefix: str, engines: list[il.Engine], samples: dict[str, list[float]]
) -> tuple[str | None, str | None]:
    """The fastest engine (least median seconds) of each toolkit, named in `out`, and seqtrain's speedup over
    transformers' best: the ratio of their medians and the spread of the per-round ratios."""
    best: dict[str, str | None] = {}
    for toolkit in ("seqtrain", "transformers"):
        medians = {
            e.name: statistics.median(samples[e.name])
            for e in engines
            if e.toolkit == toolkit and samples.get(e.name)
        }
        best[toolkit] = il.fastest(medians) if medians else None
        if best[toolkit] is not None:
            out[f"{prefix}{toolkit}_best"] = best[toolkit]
    seq, hf = best["seqtrain"], best["transformers"]
    if seq and hf:
        r = il.ratio(samples[hf], samples[seq])
        out[f"{prefix}speedup"] = r["ratio"]
        for k in ("rounds_median", "rounds_min", "rounds_max"):
            if k in r:
                out[f"{prefix}speedup_{k}"] = r[k]
    return seq, hf


# ------------------------------------------------------------------------------------------------ training
class _TrainSetup:
    """What a model size's training engines share: the updates (seqtrain's collated batches and transformers'
    one-pass batches), the initial weights, transformers' SDPA model and its optimizer (every SDPA engine
    trains the same model in turn: only the speed is compared), the FLOP counter."""

    def __init__(self, check: Any, label: str, arch: str):
        self.check, self.label, self.arch = check, label, arch
        s = check.shapes
        self.fair = check.batches.get("fair")
        self.ds, self.updates, self.second = self.fair["ds"], self.fair["updates"], self.fair["second"]
        self.warm = list(range(s.fair_warmup))
        self.timed = list(range(s.fair_warmup, s.fair_warmup + s.fair_rounds))
        self.profiled = list(range(s.fair_warmup + s.fair_rounds, len(self.updates)))
        self.state: dict[str, torch.Tensor] | None = None
        self.targs: argparse.Namespace | None = None
        self.counter: Seq2SeqFlops | None = None
        self.hf: Any = None
        self.opt: Any = None
        self.loss0: dict[str, float] = {}

    def trainer(self, compiled: bool) -> Any:
        """seqtrain's Trainer for this size (bf16; --compile), the initial weights kept for transformers'."""
        from seqtrain.models import transformer  # (the compile switch; heavy only in name)

        s = self.check.shapes
        trainer, _ = lib.make_trainer(
            self.check.dry, self.arch, s.vocab, "bf16", *(("--compile",) if compiled else ())
        )
        if compiled and self.check.dry:
            transformer.compile_layers(trainer.model, backend="eager")  # dynamo without inductor's C++ build
        if self.state is None:
            self.state = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
            self.targs = argparse.Namespace(**trainer.run_args)
            self.counter = Seq2SeqFlops.from_model(trainer.model)
        return trainer

    def initial(self) -> tuple[dict[str, torch.Tensor], argparse.Namespace]:
        if self.state is None:  # (no seqtrain engine was prepared: a trainer only for its weights)
            trainer = self.trainer(compiled=False)
            del trainer
        assert self.state is not None and self.targs is not None
        return self.state, self.targs

    def hf_model(self, attn: str = "sdpa") -> tuple[Any, torch.optim.Optimizer]:
        state, targs = self.initial()
        hf = lib.hf_model(targs, state, self.check.shapes.vocab, attn=attn).to(self.check.device).train()
        opt = torch.optim.AdamW(
            hf.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, fused=True
        )
        return hf, opt

    def shared_hf(self) -> tuple[Any, torch.optim.Optimizer]:
        if self.hf is None:
            self.hf, self.opt = self.hf_model()
        return self.hf, self.opt


def _seqtrain_engine(setup: _TrainSetup, name: str, compiled: bool) -> il.Engine:
    s = setup.check.shapes
    trainer = setup.trainer(compiled)

    def run(i: int) -> float:
        update = setup.second if i < 0 else setup.updates[i]
        stats = trainer.train_step(setup.ds.merge_update(update, s.merge_tokens))
        return stats["loss"] * math.log(2)  # base 2 -> nats, as transformers reports it

    passes = len(setup.ds.merge_update(setup.updates[0], s.merge_tokens))
    return il.Engine(name, "seqtrain", run, enter=_cudnn(False), info={"passes_per_update": passes})


def _hf_step(check: Any, model: Any, opt: Any, dynamic_rows: bool) -> Callable[[dict], torch.Tensor]:
    """transformers' update as one pass (its loss: the mean over the update's target tokens), bf16 autocast,
    fused AdamW. `dynamic_rows`: the batch dimension marked dynamic for torch.compile (updates of other row
    counts share one graph)."""

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(check.device, non_blocking=True) for k, v in batch.items()}
        if dynamic_rows:
            for v in batch.values():
                torch._dynamo.maybe_mark_dynamic(v, 0)
        with torch.autocast(check.device.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _own_code(model: Any, tag: str) -> Callable[..., Any]:
    """model(**batch) through a function with a code object of its own. Dynamo keeps compiled graphs per code
    object, and neither the cuDNN switch (read when SDPA's kernel is chosen, at tracing) nor an equal backend
    tells two torch.compile calls on one model apart: without this the cuDNN-on engine ran the graphs traced
    for the cuDNN-off one (a dry run compiled no graph for it)."""

    def forward(**batch: torch.Tensor) -> Any:
        return model(**batch)

    code = forward.__code__.replace(co_name=f"forward_{tag}")
    return types.FunctionType(code, forward.__globals__, code.co_name, None, forward.__closure__)


def _hf_engine(setup: _TrainSetup, name: str) -> il.Engine:
    check = setup.check
    compiled, cudnn = "compiled" in name, name.endswith("cudnn")
    if name == "hf_flex":
        model, opt = setup.hf_model(attn="flex_attention")  # its own: the implementation is a model setting
    else:
        model, opt = setup.shared_hf()
    if compiled:  # (traced at the first call, under enter's cuDNN switch: SDPA's kernel is chosen then)
        model = torch.compile(_own_code(model, name), backend="eager" if check.dry else "inductor")
    layout = "dynamic" if name == "hf_eager" else "fixed"
    step = _hf_step(check, model, opt, dynamic_rows=compiled)
    hf_batches = setup.fair["hf"]

    def run(i: int) -> float:
        return step(hf_batches[i][layout])

    return il.Engine(name, "transformers", run, enter=_cudnn(cudnn))


def _prepare_train(setup: _TrainSetup, name: str, toolkit: str) -> il.Engine:
    """Build engine `name` and warm it up on the warm-up updates (every engine the same ones); its first
    update's loss is kept when it ran on the initial weights."""
    check = setup.check
    before = _dynamo_counts()
    start = time.monotonic()
    if toolkit == "seqtrain":
        engine = _seqtrain_engine(setup, name, compiled=name == "seqtrain_compiled")
    else:
        engine = _hf_engine(setup, name)
    warm = []
    for n, i in enumerate(setup.warm):
        seconds, loss = gpu_check.timed(check, lambda i=i: engine(i))
        warm.append(seconds)
        if n == 0 and name in ("seqtrain_compiled", "seqtrain_eager", "hf_eager", "hf_flex"):
            setup.loss0[name] = float(loss)
    engine.info.update(prepare_s=time.monotonic() - start, warmup_s=warm, layout=TRAIN_LAYOUT[name])
    engine.info["cudnn_sdp"] = torch.backends.cuda.cudnn_sdp_enabled()  # (as the engine's enter left it)
    after = _dynamo_counts()
    if "compiled" in name:
        engine.info.update(graphs=after[1] - before[1], graph_breaks=after[2] - before[2])
    return engine


def _train_record(
    out: dict[str, Any], p: str, setup: _TrainSetup, engines: list[il.Engine], samples: dict[str, list[float]]
) -> None:
    check = setup.check
    tokens = [lib.real_tokens(setup.updates[i]) for i in setup.timed]
    flops = [
        sum(setup.counter.sample_train_flops(b, lib.PAD) for b in setup.updates[i]) if setup.counter else 0.0
        for i in setup.timed
    ]
    out[f"{p}tokens_per_update"] = sum(tokens) / len(tokens)
    for e in engines:
        secs = samples.get(e.name) or []
        out.update({f"{p}{e.name}_{k}": v for k, v in e.info.items()})
        if not secs:
            continue
        _stats(out, f"{p}{e.name}", secs, 1000.0, "ms")
        out[f"{p}{e.name}_tokens_per_s"] = statistics.median(t / x for t, x in zip(tokens, secs))
        out[f"{p}{e.name}_mfu"] = statistics.median(f / x / check.peak for f, x in zip(flops, secs))
    seq, hf = _choose(out, p, engines, samples)
    if seq:
        out[f"{p}best_mfu"] = out[f"{p}{seq}_mfu"]
        out[f"{p}seqtrain_best_tokens_per_s"] = out[f"{p}{seq}_tokens_per_s"]
    if hf:
        out[f"{p}transformers_best_tokens_per_s"] = out[f"{p}{hf}_tokens_per_s"]
        out[f"{p}transformers_best_layout"] = TRAIN_LAYOUT[hf]


def _losses(out: dict[str, Any], p: str, setup: _TrainSetup, errors: list[str]) -> None:
    """The first updates on the initial weights: seqtrain against transformers (SDPA), flex against SDPA,
    seqtrain eager against compiled; each must agree within 1e-2."""
    l0 = setup.loss0
    out.update({f"{p}{k}_loss0": v for k, v in l0.items()})
    for key, a, b in (
        ("step0_loss_rel_diff", "seqtrain_compiled", "hf_eager"),
        ("hf_flex_loss0_rel_diff", "hf_flex", "hf_eager"),
        ("seqtrain_eager_loss0_rel_diff", "seqtrain_eager", "seqtrain_compiled"),
    ):
        if a in l0 and b in l0:
            out[f"{p}{key}"] = abs(l0[a] - l0[b]) / abs(l0[b])
            if out[f"{p}{key}"] > 1e-2:
                errors.append(f"{p}{key}: {l0[a]} ({a}) against {l0[b]} ({b})")


def _second_shape(out: dict[str, Any], p: str, setup: _TrainSetup, engine: il.Engine) -> None:
    """seqtrain's compiled step on an update of another shape (other rows, tokens and max lengths): the frames
    and graphs compiled there (target 0) and its seconds."""
    before = _dynamo_counts()
    out[f"{p}second_shape_s"] = gpu_check.timed(setup.check, lambda: engine(-1))[0]
    after = _dynamo_counts()
    out[f"{p}recompiles_second_shape"] = max(after[0] - before[0], after[1] - before[1])


def _profile(out: dict[str, Any], p: str, setup: _TrainSetup, engine: il.Engine) -> None:
    check = setup.check
    prof = lib.profile_steps(
        check.device,
        [lambda i=i: engine(i) for i in setup.profiled],
        f"{check.out}/profile_fair_{setup.label}_{engine.name}.txt",
    )
    out.update({f"{p}profile_{k}": v for k, v in prof.items()})


def _train_skip(setup: _TrainSetup, name: str, need: float) -> str | None:
    """Why engine `name` is left out (a dry run's limits, the device's memory, the stage's budget), or None."""
    check = setup.check
    if name.startswith("hf_compiled"):
        return _compile_skip(check, "transformers' model")
    if name == "hf_flex" and check.dry and not getattr(check, "dry_compile", False):
        return "dry run: FlexAttention has no backward on a CPU (--dry-compile tries it)"
    if name == "seqtrain_eager" and setup.label == "bart_large" and check.device.type == "cuda":
        if torch.cuda.get_device_properties(check.device).total_memory < 100 * 2**30:
            return "memory: under 100 GiB the other engines' states and one pass fill the device"
    if check.left() < check.need(need):
        return f"budget: {check.left():.0f} s left of the stage's"
    return None


def _prepare_all(setup: _TrainSetup, out: dict[str, Any], errors: list[str], scale: float) -> list[il.Engine]:
    """TRAIN_ENGINES prepared in order while the stage's budget keeps room for the rounds after them; what is
    left out is named with its reason. An engine that fails is named too; a seqtrain engine's or hf_eager's
    failure (the comparison's pillars; the others are options) is an error of the stage."""
    p, engines = f"{setup.label}_", []
    reserve = 45 * scale  # the rounds, the second shape and the profile, after the engines
    for name, toolkit, need in TRAIN_ENGINES:
        skip = _train_skip(setup, name, need * scale + reserve)
        if skip is not None:
            out[f"{p}{name}_skipped"] = skip
            continue
        try:
            engines.append(_prepare_train(setup, name, toolkit))
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e)[:400]}"
            out[f"{p}{name}_skipped"] = f"failed: {msg}"
            out[f"{p}{name}_traceback"] = traceback.format_exc()[-1500:]
            if toolkit == "seqtrain" or name == "hf_eager":
                errors.append(f"{p}{name}: {msg}")
            _free(setup.check)
    return engines


def stage_train_fair(check: Any, label: str, arch: str, scale: float) -> dict[str, Any]:
    """One model size's fair training comparison (see the module docstring). `scale`: its preparation seconds
    against bart_large's."""
    from torch._dynamo.utils import counters  # (torch._dynamo: only where a stage compiles)

    from seqtrain.models import transformer  # (its compiled-layer cache is cleared for this size)

    out, s, p = check.stage_figures, check.shapes, f"{label}_"
    out[f"{p}arch"] = arch
    out["cudnn_sdp_default"] = gpu_check.DEFAULT_CUDNN_SDP
    errors: list[str] = []
    torch._dynamo.reset()
    transformer._compiled.cache_clear()
    counters.clear()
    _recompile_room()
    setup = _TrainSetup(check, label, arch)
    engines = _prepare_all(setup, out, errors, scale)
    out[f"{p}engines"] = [e.name for e in engines]
    if not engines:
        raise RuntimeError("no engine could be prepared")
    round_s = sum(e.info["warmup_s"][-1] for e in engines)
    rounds = s.fair_rounds if check.dry else il.rounds_that_fit(check.left() - 15, round_s, s.fair_rounds, 3)
    gpu_check.reset_memory(check)
    out[f"{p}resident_gib"] = (
        torch.cuda.memory_allocated(check.device) / 2**30 if check.device.type == "cuda" else 0.0
    )
    before = _dynamo_counts()
    result = il.alternate(engines, setup.timed, rounds, _timer(check), after_failure=lambda: _free(check))
    # (graphs compiled while the rounds ran: a compiled engine recompiling on another update's rows)
    out[f"{p}graphs_compiled_in_rounds"] = _dynamo_counts()[1] - before[1]
    out[f"{p}peak_gib"] = gpu_check.peak_memory(check)
    out[f"{p}rounds"], out[f"{p}rounds_target"] = len(result.order), s.fair_rounds
    out[f"{p}order"] = result.order
    for name, err in result.failed.items():
        out[f"{p}{name}_failed"] = err
        out[f"{p}{name}_traceback"] = result.tracebacks[name]
        if not name.startswith("hf_") or name == "hf_eager":
            errors.append(f"{p}{name} failed in the rounds: {err}")
    _train_record(out, p, setup, engines, result.samples)
    _losses(out, p, setup, errors)
    by_name = {e.name: e for e in engines}
    compiled = by_name.get("seqtrain_compiled")
    if compiled is not None and "seqtrain_compiled" not in result.failed:
        _second_shape(out, p, setup, compiled)
    best = by_name.get(out.get(f"{p}seqtrain_best", ""))
    if best is not None and setup.profiled and check.left() > check.need(10 * scale):
        _profile(out, p, setup, best)
    engines.clear()
    by_name.clear()
    setup.hf = setup.opt = None
    torch._dynamo.reset()
    if errors:
        out["errors"] = errors
    return out


def stage_train_fair_large(check: Any) -> dict[str, Any]:
    return stage_train_fair(check, "bart_large", check.shapes.large, 1.0)


def stage_train_fair_base(check: Any) -> dict[str, Any]:
    if (
        check.dry
    ):  # (a dry run's models are both bart_tiny: this would repeat train_fair_large, seconds of CI)
        return {"skip": "dry run", "skip_reason": "dry run: train_fair_large's code at the same tiny model"}
    return stage_train_fair(check, "bart_base", check.shapes.base, 0.7)


# ------------------------------------------------------------------------------------------------ generation
def _generate_engine(
    check: Any, name: str, ours: Any, hf: Any, d: Any, st: Any, width: int
) -> tuple[str, Callable[[], None], Callable[[], None] | None, Callable[[list[list[int]]], list[list[int]]]]:
    """Engine `name`'s toolkit, its enter and leave (see interleave.Engine) and its decoder (one batch -> best
    hypotheses)."""
    if name.startswith("seqtrain"):
        decode, _ = gpu_check._ours_decoder(check, ours, d, st, static=name == "seqtrain_static")
        return "seqtrain", _cudnn(False), None, decode
    static = {"cache_implementation": "static", "disable_compile": True}
    if name == "hf_dynamic":
        return "transformers", _cudnn(False), None, gpu_check._hf_decoder(check, hf, st)
    if name in ("hf_static", "hf_static_cudnn"):
        return (
            "transformers",
            _cudnn(name.endswith("cudnn")),
            None,
            gpu_check._hf_decoder(check, hf, st, **static),
        )
    # the static cache and the forward compiled, as transformers' docs show it (model.forward =
    # torch.compile(model.forward, mode="reduce-overhead")), the sources padded to one width; generate's own
    # auto-compile covers sampling and greedy search only, not beam search
    opts = {"backend": "eager"} if check.dry else {"mode": "reduce-overhead"}
    compiled = torch.compile(hf.forward, dynamic=False, **opts)

    def enter() -> None:
        torch.backends.cuda.enable_cudnn_sdp(False)
        hf.forward = compiled

    def leave() -> None:
        del hf.forward  # (the class's forward again)

    return "transformers", enter, leave, gpu_check._hf_decoder(check, hf, st, width=width, **static)


def _prepare_generate(
    check: Any, name: str, models: tuple[Any, Any, Any, Any], batches: list, width: int
) -> tuple[il.Engine, list[list[int]]]:
    """Engine `name` decoding every batch, after its warm-up passes over all of them (every engine the same:
    capture, compile, caches): the engine and the first pass's best hypotheses."""
    hf, ours, d, st = models
    before, start = _dynamo_counts(), time.monotonic()
    toolkit, enter, leave, decode = _generate_engine(check, name, ours, hf, d, st, width)
    engine = il.Engine(
        name, toolkit, lambda _, f=decode: [h for b in batches for h in f(b)], enter=enter, leave=leave
    )
    warm = [gpu_check.timed(check, lambda: engine(None)) for _ in range(check.shapes.gen_warmup)]
    after = _dynamo_counts()
    engine.info.update(prepare_s=time.monotonic() - start, warmup_s=[w for w, _ in warm])
    engine.info["cudnn_sdp"] = torch.backends.cuda.cudnn_sdp_enabled()  # (as its enter left it)
    if name == "hf_compiled_static":
        engine.info.update(graphs=after[1] - before[1], graph_breaks=after[2] - before[2])
    return engine, warm[0][1]


def _generate_skip(check: Any, name: str, precision: str, need: float) -> str | None:
    if name == "hf_compiled_static":
        skip = _compile_skip(check, "transformers' forward")
        if skip:
            return skip
    if name == "hf_static_cudnn" and precision == "fp32":
        return "cuDNN attention is half precision only"
    if check.left() < check.need(need + 15):  # (15 s: the timed passes)
        return f"budget: {check.left():.0f} s left of the stage's"
    return None


def _generate_precision(
    check: Any, out: dict[str, Any], precision: str, models: tuple[Any, Any, Any, Any], sources: list
) -> list[str]:
    """One precision's engines (GENERATE_ENGINES, in order, as the budget allows), alternated timed passes
    and figures (prefix `precision`_). A failure of seqtrain's static path or transformers' default generate
    (the comparison's pillars) is an error of the stage; the other engines are named with why they are out."""
    s = check.shapes
    p, errors = f"{precision}_", []
    batches = [sources[i : i + s.gen_batch] for i in range(0, len(sources), s.gen_batch)]
    width = bucketed(max(len(x) for x in sources))
    out["compiled_source_width"] = width
    engines, hyps = [], {}
    for name, need in GENERATE_ENGINES:
        skip = _generate_skip(check, name, precision, need)
        if skip is not None:
            out[f"{p}{name}_skipped"] = skip
            continue
        try:
            engine, hyps[name] = _prepare_generate(check, name, models, batches, width)
            engines.append(engine)
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e)[:400]}"
            out[f"{p}{name}_skipped"] = f"failed: {msg}"
            out[f"{p}{name}_traceback"] = traceback.format_exc()[-1500:]
            if name in ("seqtrain_static", "hf_dynamic"):
                errors.append(f"{p}{name}: {msg}")
            _free(check)
    out[f"{p}engines"] = [e.name for e in engines]
    result = il.alternate(engines, [None], s.gen_rounds, _timer(check), after_failure=lambda: _free(check))
    out[f"{p}rounds"], out[f"{p}order"] = len(result.order), result.order
    n = len(sources)
    for e in engines:
        out.update({f"{p}{e.name}_{k}": v for k, v in e.info.items()})
        if e.name in result.failed:
            out[f"{p}{e.name}_failed"] = result.failed[e.name]
        if result.samples.get(e.name):
            _stats(out, f"{p}{e.name}", result.samples[e.name], 1.0, "s")
            out[f"{p}{e.name}_sentences_per_s"] = n / statistics.median(result.samples[e.name])
        if "seqtrain_static" in hyps and e.name != "seqtrain_static":
            out[f"{p}{e.name}_identical"] = sum(a == b for a, b in zip(hyps[e.name], hyps["seqtrain_static"]))
    _choose(out, p, engines, result.samples)
    if precision == "fp32" and "hf_dynamic" in hyps and "seqtrain_static" in hyps:
        out["fp32_identical_transformers"] = out["fp32_hf_dynamic_identical"]
        out["fp32_identical_share"] = out["fp32_identical_transformers"] / n
        if out["fp32_identical_transformers"] < n:
            errors.append(f"fp32 best hypotheses differ: {out['fp32_identical_transformers']}/{n} identical")
    return errors


def stage_generate_fair(check: Any) -> dict[str, Any]:
    s = check.shapes
    out = check.stage_figures
    out["cudnn_sdp_default"] = gpu_check.DEFAULT_CUDNN_SDP
    st, hf, ours, d, sources = gpu_check._generate_setup(check, s.gen_sentences)
    out.update(sentences=len(sources), batch_size=s.gen_batch, beam=st.beam, rounds_target=s.gen_rounds)
    errors = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the hypotheses must be identical
    _recompile_room()
    # bf16 first (the headline), on copies in bf16 weights (as seqtrain-generate --bf16 and transformers'
    # torch_dtype=torch.bfloat16 run), then fp32 on the models as made
    half = (copy.deepcopy(hf).to(torch.bfloat16), copy.deepcopy(ours).to(torch.bfloat16))
    try:
        with torch.no_grad():
            for precision, (hf_, ours_) in (("bf16", half), ("fp32", (hf, ours))):
                errors += _generate_precision(check, out, precision, (hf_, ours_, d, st), sources)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch._dynamo.reset()
    if errors:
        out["errors"] = errors
    return out


def _recompile_room() -> None:
    """Room for the compiled engines' graphs in dynamo's per-function cache: generation's first and later
    steps in bf16 and fp32; flex attention's kernel at each attention's shapes (encoder, decoder, cross) and
    row counts. The default, 8, would send the last ones back to eager (flex: its unfused fallback)."""
    config = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, key):
            setattr(config, key, max(getattr(config, key), 32))
