#!/usr/bin/env python
"""Benchmark seqtrain-generate against CTranslate2 on the CPU: the same weights, sources and beam search.

Both engines get the same model the way a user gets it: a seqtrain checkpoint, `seqtrain-convert --to hf`,
then CTranslate2's converter on that folder (fp32, and --quantization int8 for int8). seqtrain decodes through
seqtrain-generate's library path (runner: batches, beam search, --compute-type), CTranslate2 through
Translator.translate_batch on the same token ids (as vocabulary tokens). The search is the quickstart's (beam 4,
lenpen 1, --no-repeat-ngram-size 3 (--no-repeat-ngram-size 0: none), sources cut at 48 tokens) with --max-len-b 60,
batches of 32 sentences.

Sizes: `small` is the bundled pretrained bart_small (models/debdesc-small-denoising, trained weights; the
quickstart's model before fine-tuning) with the quickstart's 48 source positions; `base` is bart_base's shape
with random weights drawn wide so the next-token distribution is peaked (as bench_generate.py's), over the same
dictionary. Precisions: fp32 (seqtrain's default; CTranslate2 float32) and int8 (seqtrain --compute-type int8;
CTranslate2 int8 weights). Threads: 1 and 2 (torch.set_num_threads; CTranslate2 intra_threads).

Reported per row: sentences/s of each engine (median over rounds; the engines alternate inside each round, the
first one swapping every round), the share of sentences whose best hypotheses are token for token identical, and
the peak RSS of a fresh process that loads the model and decodes the sentences once (benchlib's high-water mark,
model included).

    python scripts/bench/bench_ctranslate2.py                       # both sizes, fp32 and int8, 1 and 2 threads
    python scripts/bench/bench_ctranslate2.py --sizes small --threads 1 --rounds 2 --no-repeat-ngram-size 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchlib import peak_weights_  # noqa: E402  (scripts/bench/benchlib.py)

from seqtrain.checkpoint.fairseq import model_config  # noqa: E402
from seqtrain.checkpoint.files import save_checkpoint_file  # noqa: E402
from seqtrain.checkpoint.load import load_model  # noqa: E402
from seqtrain.checkpoint.native import make_checkpoint_state  # noqa: E402
from seqtrain.models.bart import build_model  # noqa: E402

PRETRAINED = os.path.join(REPO, "models", "debdesc-small-denoising")
SOURCES = os.path.join(REPO, "data", "debdesc-sample", "valid.source")
# the quickstart's search, with room for the denoising model's outputs (it rebuilds its <= 48-token source) to end
# with a real </s>: at the max length seqtrain forces </s> and CTranslate2 does not (docs/finetune.md)
SEARCH = dict(beam=4, lenpen=1.0, max_len_b=60, min_len=1, no_repeat_ngram_size=3)
MAX_SOURCE = 48
BATCH = 32


FINETUNED = os.path.join(REPO, ".quickstart", "checkpoints", "checkpoint_best.pt")


def make_models(workdir: str, size: str, finetuned: str = FINETUNED) -> dict[str, str]:
    """{"ckpt", "hf", "ct2-float32", "ct2-int8"} paths for a size, made once in `workdir`. `finetuned`: the
    checkpoint the `finetuned` size converts (the quickstart's model, what issue 47 measured)."""
    import ctranslate2

    from seqtrain_cli.convert import main as convert

    tag = size
    if size == "finetuned":  # a new checkpoint at that path is a new model
        st = os.stat(finetuned)
        tag = f"finetuned-{abs(hash((os.path.abspath(finetuned), st.st_mtime_ns, st.st_size))) % 10**8}"
    paths = {k: os.path.join(workdir, f"{tag}-{k}") for k in ("hf", "ct2-float32", "ct2-int8")}
    paths["ckpt"] = os.path.join(workdir, f"{tag}.pt")
    if os.path.isdir(paths["ct2-int8"]):
        return paths
    lm = load_model(
        finetuned if size == "finetuned" else PRETRAINED, arch_overrides={"max_source_positions": MAX_SOURCE}
    )
    args, state = lm.args, {k: v.float() for k, v in lm.model.state_dict().items()}
    if size == "base":
        args = argparse.Namespace(
            arch="bart_base", dropout=0.0, max_source_positions=MAX_SOURCE, max_target_positions=128
        )
        torch.manual_seed(0)
        model = build_model(model_config(args), lm.src_dict, lm.tgt_dict)
        peak_weights_(model, 3.0)  # </s> likely enough to end hypotheses at varied lengths
        state = {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint_file(
        make_checkpoint_state(args, state, lm.src_dict, lm.tgt_dict, lm.tokenizer_spec), paths["ckpt"]
    )
    convert([paths["ckpt"], paths["hf"], "--to", "hf"])
    for q in ("float32", "int8"):
        ctranslate2.converters.TransformersConverter(paths["hf"]).convert(paths[f"ct2-{q}"], quantization=q)
    return paths


# seqtrain's levers, each one engine: the eager step (MKL products, Python per layer, the two-step candidate
# step), then the compiled step with torch's MKL products and the two-step candidate step, then with the fused
# candidate step, then (the default) with oneDNN products; `seqtrain` is the default path
VARIANTS = {
    "eager": dict(cpu_step=False),
    "compiled-mkl-unfused": dict(gemm="mkl", fused=False),
    "compiled-mkl": dict(gemm="mkl"),
    "compiled": dict(),
}


class Seqtrain:
    def __init__(self, paths: dict[str, str], precision: str, lines: list[str], variant: str = "compiled"):
        from seqtrain.generation import runner
        from seqtrain.generation.search import GenerationConfig
        from seqtrain.generation.sequence_generator import build_generator

        self.runner = runner
        self.loaded = runner.load_for_generation(paths["ckpt"])
        runner.set_compute_type(self.loaded, "int8" if precision == "int8" else "default")
        self.gen = build_generator(
            self.loaded.model,
            self.loaded.lm.tgt_dict,
            GenerationConfig(**SEARCH),
            bos=self.loaded.start,
            eos=self.loaded.end,
        )
        self.ds = runner.text_dataset(self.loaded, runner.encode(self.loaded, lines))
        self.batches = runner.plan_batches(self.ds, runner.order_examples(self.ds), None, BATCH)
        self.n = len(lines)
        lever = VARIANTS[variant]
        self.gemm = lever.get("gemm", "")
        if lever.get("cpu_step") is False:
            self.gen.cpu_step = False
        if lever.get("fused") is False:
            self.gen.decode_step.fusable = lambda beams: False

    def __call__(self) -> list[list[int]]:
        os.environ["SEQTRAIN_CPU_GEMM"] = (
            self.gemm
        )  # (each engine holds its own model: its own packed weights)
        out: list[list[int]] = [[] for _ in range(self.n)]
        for sid, _, _, hypos in self.runner.run_batches(self.loaded, self.gen, self.ds, self.batches):
            out[sid] = hypos[0]["tokens"].tolist()[:-1]
        return out


class CTranslate2:
    def __init__(self, paths: dict[str, str], precision: str, lines: list[str], threads: int):
        import ctranslate2
        from transformers import AutoTokenizer

        model = paths["ct2-int8" if precision == "int8" else "ct2-float32"]
        tok = AutoTokenizer.from_pretrained(paths["hf"])
        with open(os.path.join(model, "shared_vocabulary.json"), encoding="utf-8") as f:
            self.vocab = json.load(f)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.source = [[self.vocab[i] for i in tok(line)["input_ids"]] for line in lines]
        compute = "int8" if precision == "int8" else "float32"
        self.translator = ctranslate2.Translator(
            model, device="cpu", compute_type=compute, intra_threads=threads, inter_threads=1
        )

    def __call__(self) -> list[list[int]]:
        s = SEARCH
        results = self.translator.translate_batch(
            self.source,
            max_batch_size=BATCH,
            beam_size=s["beam"],
            length_penalty=s["lenpen"],
            no_repeat_ngram_size=s["no_repeat_ngram_size"],
            min_decoding_length=s["min_len"],
            max_decoding_length=s["max_len_b"] + 1,
            max_input_length=MAX_SOURCE,
            suppress_sequences=[["<pad>"]],
        )
        return [[self.index[t] for t in r.hypotheses[0]] for r in results]


def make_engine(engine: str, paths: dict[str, str], precision: str, lines: list[str], threads: int):
    """`seqtrain` (its default path), `seqtrain[VARIANT]` (a lever of VARIANTS) or `ctranslate2`."""
    torch.set_num_threads(threads)
    if engine == "seqtrain":
        return Seqtrain(paths, precision, lines)
    if engine.startswith("seqtrain["):
        return Seqtrain(paths, precision, lines, engine[len("seqtrain[") : -1])
    return CTranslate2(paths, precision, lines, threads)


def engine_names(a: argparse.Namespace) -> list[str]:
    extra = [f"seqtrain[{v}]" for v in a.variants.split(",") if v] if a.variants else []
    for e in extra:
        if e[len("seqtrain[") : -1] not in VARIANTS:
            raise SystemExit(f"--variants: {e} is not one of {', '.join(VARIANTS)}")
    return ["seqtrain", "ctranslate2", *extra]


def memory_probe(spec: str) -> None:
    """(In a fresh process) load one engine, decode once, print the peak RSS in MiB."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchlib import MIB, _status_bytes

    global SOURCES
    engine, paths_json, precision, threads, n, SOURCES, search = json.loads(spec)
    SEARCH.update(search)
    lines = read_lines(n)
    make_engine(engine, json.loads(paths_json), precision, lines, threads)()
    print(json.dumps({"peak_rss_mib": _status_bytes("VmHWM") / MIB}))


def read_lines(n: int) -> list[str]:
    with open(SOURCES, encoding="utf-8") as f:
        return f.read().split("\n")[:n]


def sentences_for(a: argparse.Namespace, size: str) -> int:
    return {"small": a.sentences, "base": a.sentences_base, "finetuned": a.sentences_finetuned}[size]


def peak_rss(engine: str, paths: dict[str, str], precision: str, threads: int, n: int) -> float:
    spec = json.dumps([engine, json.dumps(paths), precision, threads, n, SOURCES, SEARCH])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(
        [sys.executable, __file__, "--memory-probe", spec],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_rss_mib"]


def settings(a: argparse.Namespace):
    """(size, paths, sentences, lines, precision, threads) for every row the flags ask for, models made once."""
    for size in a.sizes.split(","):
        paths = make_models(a.workdir, size, a.finetuned)
        n = sentences_for(a, size)
        lines = read_lines(n)
        for precision in a.precisions.split(","):
            for threads in map(int, a.threads.split(",")):
                yield size, paths, n, lines, precision, threads


CLOCK = time.perf_counter


def alternate(engines: dict, rounds: int, threads: int) -> dict[str, list[float]]:
    """Seconds of each engine's pass in each round; the engines alternate, the order reversed every other round.
    The clock is the wall's, or with --clock process this process's CPU time (on a machine other work loads, a
    one-thread pass's CPU seconds are what it costs, its wall seconds what it waited for too)."""
    times: dict[str, list[float]] = {e: [] for e in engines}
    for r in range(rounds):
        for e in list(engines) if r % 2 == 0 else list(engines)[::-1]:
            torch.set_num_threads(threads)
            t = CLOCK()
            engines[e]()
            times[e].append(CLOCK() - t)
    return times


def main() -> None:
    global SOURCES, CLOCK
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="small,base")
    p.add_argument("--precisions", default="fp32,int8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--sentences", type=int, default=64, help="valid sources decoded per pass (small)")
    p.add_argument(
        "--sentences-base", type=int, default=16, help="the same for base (random weights: slower)"
    )
    p.add_argument(
        "--sentences-finetuned", type=int, default=300, help="the same for finetuned (the test split's 300)"
    )
    p.add_argument(
        "--finetuned",
        default=FINETUNED,
        help="the checkpoint --sizes finetuned converts (default: the quickstart's checkpoint_best.pt)",
    )
    p.add_argument(
        "--sources", default=SOURCES, help="the sources decoded (default: the sample's valid split)"
    )
    p.add_argument("--max-len-b", type=int, default=SEARCH["max_len_b"])
    p.add_argument("--no-repeat-ngram-size", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "seqtrain-bench-ct2"))
    p.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    p.add_argument(
        "--steps-sweep",
        help="comma list of --max-len-b values (e.g. 0,4,16): time both engines at each (every hypothesis runs to "
        "the limit while it is shorter than the outputs), then split a pass into its fixed part (encoder, "
        "set-up) and its cost per decoding step",
    )
    p.add_argument(
        "--variants",
        default="",
        help=f"also time seqtrain's levers one by one, comma-separated from {', '.join(VARIANTS)}",
    )
    p.add_argument(
        "--clock",
        choices=["wall", "process"],
        default="wall",
        help="wall seconds (an idle machine), or this process's CPU seconds (one thread on a busy machine)",
    )
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)
    a = p.parse_args()
    CLOCK = time.process_time if a.clock == "process" else time.perf_counter
    if a.memory_probe:
        return memory_probe(a.memory_probe)
    os.makedirs(a.workdir, exist_ok=True)
    SOURCES = a.sources
    SEARCH["no_repeat_ngram_size"] = a.no_repeat_ngram_size
    SEARCH["max_len_b"] = a.max_len_b
    if a.steps_sweep:
        return steps_sweep(a)
    print(f"# load average at start: {os.getloadavg()[0]:.2f}; search {SEARCH}; clock {a.clock}")
    rows, lever_rows = [], []
    names = engine_names(a)
    for size, paths, n, lines, precision, threads in settings(a):
        engines = {e: make_engine(e, paths, precision, lines, threads) for e in names}
        hyps = {e: engines[e]() for e in engines}  # warm-up pass, and the hypotheses compared
        times = alternate(engines, a.rounds, threads)
        same = sum(x == y for x, y in zip(hyps["seqtrain"], hyps["ctranslate2"])) / len(lines)
        # where CTranslate2 ended with </s> before the max length (there it returns its best unfinished
        # hypothesis, seqtrain and fairseq force </s>): the sentences both engines search by the same rules
        ended = [
            (x, y) for x, y in zip(hyps["seqtrain"], hyps["ctranslate2"]) if len(y) <= SEARCH["max_len_b"]
        ]
        same_ended = sum(x == y for x, y in ended) / max(len(ended), 1)
        mem = {e: float("nan") for e in ("seqtrain", "ctranslate2")}
        if not a.no_memory:
            mem = {e: peak_rss(e, paths, precision, threads, n) for e in mem}
        sps = {e: len(lines) / statistics.median(times[e]) for e in engines}
        rows.append((size, precision, threads, n, sps, f"{same:.0%} ({same_ended:.0%} of {len(ended)})", mem))
        for e in names[2:]:
            as_default = sum(x == y for x, y in zip(hyps[e], hyps["seqtrain"])) / len(lines)
            lever_rows.append((size, precision, threads, e, sps[e], sps[e] / sps["ctranslate2"], as_default))
        print(
            f"{size:5} {precision:4} {threads}t  seqtrain {sps['seqtrain']:6.1f}/s  "
            f"ctranslate2 {sps['ctranslate2']:6.1f}/s  ratio {sps['seqtrain'] / sps['ctranslate2']:.2f}  "
            f"identical {same:.0%} ({same_ended:.0%} of the {len(ended)} CTranslate2 ended)  "
            f"RSS {mem['seqtrain']:.0f} / {mem['ctranslate2']:.0f} MiB"
            + "".join(f"  {e} {sps[e]:.1f}/s" for e in names[2:]),
            flush=True,
        )
        del engines
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")
    print()
    print(
        "| size | precision | threads | sentences | seqtrain sent/s | CTranslate2 sent/s | seqtrain / CT2 "
        "| identical (of those CT2 ended with </s>) | peak RSS seqtrain / CT2 (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for size, precision, threads, n, sps, same, mem in rows:
        ratio = sps["seqtrain"] / sps["ctranslate2"]
        print(
            f"| {size} | {precision} | {threads} | {n} | {sps['seqtrain']:.1f} | {sps['ctranslate2']:.1f} | "
            f"{ratio:.2f}x | {same} | {mem['seqtrain']:.0f} / {mem['ctranslate2']:.0f} |"
        )
    if lever_rows:
        print()
        print(
            "| size | precision | threads | seqtrain lever | sent/s | / CT2 | hypotheses as the default path's |"
        )
        print("|---|---|---|---|---|---|---|")
        for size, precision, threads, e, v, ratio, as_default in lever_rows:
            print(f"| {size} | {precision} | {threads} | {e} | {v:.1f} | {ratio:.2f}x | {as_default:.0%} |")


def steps_sweep(a: argparse.Namespace) -> None:
    """Seconds per pass of each engine at each --max-len-b of `a.steps_sweep` (engines alternated per round,
    medians), then a least-squares line through them: the fixed part of a pass and its seconds per decoding
    step. Valid while the outputs are longer than the largest limit (the denoising model rebuilds its source)."""
    limits = [int(x) for x in a.steps_sweep.split(",")]
    names = engine_names(a)
    print(f"# load average at start: {os.getloadavg()[0]:.2f}; search {SEARCH}; max-len-b sweep {limits}")
    print(
        "| size | precision | threads | sentences | max-len-b | "
        + " | ".join(f"{e} s/pass" for e in names)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(names))
    fits = []
    for size, paths, n, lines, precision, threads in settings(a):
        secs: dict[str, list[float]] = {e: [] for e in names}
        for limit in limits:
            SEARCH["max_len_b"] = limit
            engines = {e: make_engine(e, paths, precision, lines, threads) for e in secs}
            for e in engines:
                engines[e]()  # warm-up
            times = alternate(engines, a.rounds, threads)
            for e in engines:
                secs[e].append(statistics.median(times[e]))
            print(
                f"| {size} | {precision} | {threads} | {n} | {limit} | "
                + " | ".join(f"{secs[e][-1]:.3f}" for e in names)
                + " |",
                flush=True,
            )
            del engines
        for e in secs:
            slope, fixed = statistics.linear_regression(limits, secs[e])
            fits.append((size, precision, threads, e, fixed, slope))
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")
    print()
    print("| size | precision | threads | engine | fixed s/pass (encoder, set-up) | s per decoding step |")
    print("|---|---|---|---|---|---|")
    for size, precision, threads, e, fixed, slope in fits:
        print(f"| {size} | {precision} | {threads} | {e} | {fixed:.3f} | {slope * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
