#!/usr/bin/env python
"""seqtrain against fairseq 0.12 itself, each through its own CLI, on the same data-bin with the same flags.

Training: `seqtrain-train` and `fairseq-train` (bart_base, label-smoothed CE, adam, inverse_sqrt,
--max-tokens, --truncate-source, fp32 on the CPU) for --updates updates, runs alternated (the order flips
every round) so background load hits both alike. Per tool: training tokens/s (target tokens of the updates
after the first, over their time, from each tool's own per-update log), the losses, the process's wall time,
and the peak RSS of its process tree. Optionally (--seqtrain-bf16) seqtrain's --bf16 runs as well, in training
and generation (counted against fairseq's fp32 hypotheses): fairseq cannot use bf16 on a CPU; and
(--seqtrain-bf16-fairseq) seqtrain's --bf16 --bf16-mode fairseq, fairseq's own bf16 semantics (a bf16 model over
fp32 master weights), in training (its generation is --bf16's: the model cast to bf16).

Generation: `seqtrain-generate` and `fairseq-generate` with fairseq's checkpoint of the first training run
(or --gen-path) on the first --examples validation pairs: sentences/s of the whole process, how many best
hypotheses are identical, peak RSS.

The physical limit beside every figure: this CPU's fp32 and bf16 matrix-product peak, measured in the same run
(seqtrain.train.flops.measured_matmul_peak, as many threads as the tools use), and each training run's useful FLOP/s
against it: tokens/s x FLOPs per target token, the latter the data-bin's FLOP count (seqtrain.train.flops, source
and target tokens, attention included) over its target tokens. The two tools batch differently (see the
fairseq-fidelity issue), so per-update work is equal only on average.

    .venv/bin/python scripts/bench/bench_fairseq.py --updates 5 --examples 64     # short mode, a few minutes
    .venv/bin/python scripts/bench/bench_fairseq.py --updates 30 --rounds 2 --seqtrain-bf16
    .venv/bin/python scripts/bench/bench_fairseq.py --updates 8 --examples 0 --seqtrain-bf16 --seqtrain-bf16-fairseq

Needs the fairseq peer venv ($HOME/.cache/seqtrain-peers/fairseq, made by ../shared/tools/fairseq-peer.sh);
without it the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from seqtrain.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder  # noqa: E402
from seqtrain.train.flops import Seq2SeqFlops, measured_matmul_peak  # noqa: E402

PEER = os.path.expanduser(os.environ.get("FAIRSEQ_PEER", "~/.cache/seqtrain-peers/fairseq"))
SEQTRAIN_BIN = os.path.dirname(sys.executable)
FAIRSEQ_ENV = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # fairseq 0.12 unpickles its own checkpoints
BART_BASE = Seq2SeqFlops(6, 6, 768, 768, 3072, 3072, 0)  # the vocabulary comes from the data-bin
# seqtrain's precision variants: the flags each tool name adds
PRECISION = {
    "seqtrain": [],
    "seqtrain-bf16": ["--bf16"],
    "seqtrain-bf16-fairseq": ["--bf16", "--bf16-mode", "fairseq"],
}


# ------------------------------------------------------------------------------------------------ processes
def _tree_memory_kb(root: int) -> tuple[int, int]:
    """Resident memory (kB) of `root` and all its descendants: (RSS, PSS). RSS counts a page shared by two
    processes (a forked DataLoader worker and its parent) twice; PSS splits it between them, so the tree's PSS
    is the physical memory the run holds."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    rss = pss = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def run(cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> dict[str, float]:
    """Run `cmd`, output to `log_path`; returns wall seconds and the peak RSS and PSS of its process tree."""
    peak = [0, 0]
    with open(log_path, "w", encoding="utf-8") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=REPO
        )

        def sample() -> None:
            while proc.poll() is None:
                rss, pss = _tree_memory_kb(proc.pid)
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        seconds = time.perf_counter() - start
        sampler.join()
    if rc != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-2000:]
        raise SystemExit(f"{' '.join(cmd[:2])} failed (exit {rc}); the end of {log_path}:\n{tail}")
    return {"wall_s": seconds, "peak_rss_gb": peak[0] / 1e6, "peak_pss_gb": peak[1] / 1e6}


# ------------------------------------------------------------------------------------------------ data
FULL_DATA = os.path.join(os.path.dirname(REPO), "shared", "data", "debdesc")
SAMPLE_DATA = os.path.join(REPO, "data", "debdesc-sample")


def ensure_databin(workdir: str, raw: str) -> str:
    dest = os.path.join(workdir, "databin-" + ("debdesc-full" if raw == FULL_DATA else "debdesc-sample"))
    if os.path.exists(os.path.join(dest, "preprocess.json")):
        return dest
    print(f"building {dest} from {raw} (sentencepiece 8k, joined dictionary; once)", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "seqtrain_cli.preprocess",
        "--source-lang",
        "source",
        "--target-lang",
        "target",
        "--trainpref",
        os.path.join(raw, "train"),
        "--validpref",
        os.path.join(raw, "valid"),
        "--destdir",
        dest,
        "--joined-dictionary",
        "--spm-vocab-size",
        "8000",
        "--no-progress-bar",
    ]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return dest


def gen_databin(databin: str, workdir: str, examples: int) -> str:
    """A copy of `databin` whose valid split holds its first `examples` pairs."""
    dest = os.path.join(workdir, f"gen-{examples}")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for name in os.listdir(databin):
        if not name.startswith(("train.", "valid.", "test.")):
            shutil.copy(os.path.join(databin, name), dest)
    for lang in ("source", "target"):
        prefix = f"valid.source-target.{lang}"
        data = MMapIndexedDataset(os.path.join(databin, prefix))
        builder = MMapIndexedDatasetBuilder(os.path.join(dest, prefix + ".bin"), dtype=data.dtype)
        for i in range(min(examples, len(data))):
            builder.add_item(data[i])
        builder.finalize(os.path.join(dest, prefix + ".idx"))
    return dest


def flops_per_target_token(databin: str, max_source: int = 1024) -> float:
    """The training FLOPs of the train split (bart_base, sources cut as --truncate-source does) per target
    token: the factor from tokens/s to useful FLOP/s."""
    src = MMapIndexedDataset(os.path.join(databin, "train.source-target.source")).sizes.clip(max=max_source)
    tgt = MMapIndexedDataset(os.path.join(databin, "train.source-target.target")).sizes
    with open(os.path.join(databin, "dict.target.txt"), encoding="utf-8") as f:
        vocab = 4 + sum(1 for _ in f)
    counter = Seq2SeqFlops(**{**BART_BASE.__dict__, "vocab": vocab})
    return counter.train_flops(src.tolist(), tgt.tolist()) / float(tgt.sum())


# ------------------------------------------------------------------------------------------------ runs
def train_flags(args: argparse.Namespace, databin: str) -> list[str]:
    return [
        databin,
        "--arch",
        "bart_base",
        "--task",
        "translation",
        "--source-lang",
        "source",
        "--target-lang",
        "target",
        "--truncate-source",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--lr",
        "3e-4",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "10",
        "--max-tokens",
        str(args.max_tokens),
        "--max-update",
        str(args.updates),
        "--dropout",
        "0.1",
        "--seed",
        "1",
        "--cpu",
        "--num-workers",
        "1",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--disable-validation",
    ]


def parse_train_log(path: str) -> dict[str, float]:
    """Per-update records of a json log (both tools print fairseq's `| train_inner | {...}` lines)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "train_inner" in line and "{" in line:
                rows.append(json.loads(line[line.index("{") :]))
    if len(rows) < 2:
        raise SystemExit(f"{path}: fewer than 2 per-update log lines")
    timed = rows[1:]  # the first update pays for start-up work
    tokens = sum(float(r["wpb"]) for r in timed)
    seconds = sum(float(r["wpb"]) / float(r["wps"]) for r in timed)
    return {
        "updates": len(rows),
        "batches": [(float(r["bsz"]), float(r["wpb"])) for r in rows],
        "losses": [float(r["loss"]) for r in rows],
        "tokens_per_s": tokens / seconds,
        "first_loss": float(rows[0]["loss"]),
        "last_loss": float(rows[-1]["loss"]),
        "mean_wpb": tokens / len(timed),
    }


def init_weights(args: argparse.Namespace, databin: str) -> str:
    """One bart_base starting point for both tools (so equal batches give equal losses): seqtrain-train's
    weights after one update, exported as a fairseq model.pt; both runs start from it with
    --finetune-from-model."""
    out = os.path.join(args.workdir, "init", "model.pt")
    if os.path.exists(out):
        return out
    save = os.path.join(args.workdir, "init-ckpt")
    shutil.rmtree(save, ignore_errors=True)
    saved, args.updates = args.updates, 1
    cmd = [os.path.join(SEQTRAIN_BIN, "seqtrain-train"), *train_flags(args, databin), "--save-dir", save]
    args.updates = saved
    run([*cmd, "--no-epoch-checkpoints"], os.path.join(args.workdir, "init.log"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    convert = [os.path.join(SEQTRAIN_BIN, "seqtrain-convert"), "--to", "fairseq"]
    run(
        [*convert, os.path.join(save, "checkpoint_last.pt"), out],
        os.path.join(args.workdir, "init-convert.log"),
    )
    return out


def train_run(
    tool: str, args: argparse.Namespace, databin: str, workdir: str, tag: str, save_dir: str | None
) -> dict[str, float]:
    flags = train_flags(args, databin) + ["--finetune-from-model", args.init]
    flags += ["--save-dir", save_dir, "--no-epoch-checkpoints"] if save_dir else ["--no-save"]
    log = os.path.join(workdir, f"train-{tag}.log")
    if tool == "fairseq":
        cmd = [os.path.join(PEER, "bin", "fairseq-train"), *flags]
        res = run(cmd, log, FAIRSEQ_ENV)
    else:
        cmd = [os.path.join(SEQTRAIN_BIN, "seqtrain-train"), *flags, *PRECISION[tool]]
        res = run(cmd, log)
    return {**res, **parse_train_log(log)}


def hypotheses(path: str) -> dict[int, str]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^H-(\d+)\t[^\t]*\t(.*)$", line.rstrip("\n"))
            if m:
                out.setdefault(int(m.group(1)), m.group(2))
    return out


def generate_run(
    tool: str, gen_bin: str, ckpt: str, workdir: str, tag: str, batch: int, extra: list[str]
) -> dict[str, Any]:
    flags = [
        gen_bin,
        "--path",
        ckpt,
        "--gen-subset",
        "valid",
        "--beam",
        "4",
        "--max-len-b",
        "30",
        "--batch-size",
        str(batch),
        "--cpu",
        "--source-lang",
        "source",
        "--target-lang",
        "target",
        *extra,
    ]
    log = os.path.join(workdir, f"generate-{tag}.log")
    if tool == "fairseq":
        res = run(
            [os.path.join(PEER, "bin", "fairseq-generate"), *flags],
            log,
            FAIRSEQ_ENV,
        )
    else:  # seqtrain, or seqtrain-bf16
        bf16 = ["--bf16"] if tool.endswith("bf16") else []
        res = run([os.path.join(SEQTRAIN_BIN, "seqtrain-generate"), *flags, *bf16], log)
    hyps = hypotheses(log)
    return {**res, "sentences": len(hyps), "sentences_per_s": len(hyps) / res["wall_s"], "hyps": hyps}


def generate_both(
    args: argparse.Namespace, gen_bin: str, ckpt: str, tag: str, batch: int, extra: list[str]
) -> dict[str, list[dict[str, Any]]]:
    tools = ["seqtrain", "fairseq"] + (["seqtrain-bf16"] if args.seqtrain_bf16 else [])
    gen: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for r in range(args.rounds):
        for tool in tools if r % 2 == 0 else tools[::-1]:
            res = generate_run(tool, gen_bin, ckpt, args.workdir, f"{tag}-{tool}-{r}", batch, extra)
            gen[tool].append(res)
            brief = {k: v for k, v in res.items() if k != "hyps"}
            print(f"generate {tag} {tool} round {r}: {json.dumps(brief)}", flush=True)
    return gen


# debdesc_small (configs/debdesc_small.yaml) generates with its sources cut to 48 pieces; fairseq needs the
# same flags spelled out (its task, not the model, truncates). Without the config's --no-repeat-ngram-size 3:
# fairseq 0.12 ignores it on a CPU (its NGramRepeatBlock checks the padded end of the token buffer, not the
# last generated tokens: facebookresearch/fairseq#4709, #5206), so with it the outputs cannot be compared.
SMALL_GEN_FLAGS = ["--truncate-source", "--max-source-positions", "48"]


def train_small(args: argparse.Namespace, databin: str) -> str:
    """seqtrain-train debdesc_small for --small-updates updates, exported as a fairseq model.pt."""
    save = os.path.join(args.workdir, "small-ckpt")
    out = os.path.join(args.workdir, "small-fairseq", "model.pt")
    if os.path.exists(out) and os.path.exists(os.path.join(save, "checkpoint_last.pt")):
        return out
    shutil.rmtree(save, ignore_errors=True)
    cmd = [
        os.path.join(SEQTRAIN_BIN, "seqtrain-train"),
        databin,
        "--config",
        os.path.join(REPO, "configs", "debdesc_small.yaml"),
        "--max-update",
        str(args.small_updates),
        "--save-dir",
        save,
        "--disable-validation",
        "--cpu",
        "--seed",
        "1",
    ]
    print(f"training debdesc_small for {args.small_updates} updates (once)", flush=True)
    run(cmd, os.path.join(args.workdir, "train-small.log"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    convert = [
        os.path.join(SEQTRAIN_BIN, "seqtrain-convert"),
        "--to",
        "fairseq",
        os.path.join(save, "checkpoint_last.pt"),
        out,
    ]
    run(convert, os.path.join(args.workdir, "convert-small.log"))
    return out


def profile_both(args: argparse.Namespace, databin: str) -> dict[str, str]:
    """torch.profiler tables of both tools' training runs (scripts/bench/profile_cli.py), written to the workdir."""
    script = os.path.join(REPO, "scripts", "profile_cli.py")
    saved, args.updates = args.updates, args.profile_updates
    flags = train_flags(args, databin) + ["--no-save"]
    args.updates = saved
    out = {}
    for tool, python, module, env in [
        ("seqtrain", sys.executable, "seqtrain_cli.train", {}),
        ("fairseq", os.path.join(PEER, "bin", "python"), "fairseq_cli.train", FAIRSEQ_ENV),
    ]:
        path = os.path.join(args.workdir, f"profile-{tool}.txt")
        run([python, script, "--out", path, "--", module, *flags], path + ".log", env)
        out[tool] = path
        print(f"profile {tool}: {path}", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=30, help="training updates per run")
    p.add_argument("--rounds", type=int, default=1, help="alternated rounds (each runs every tool once)")
    p.add_argument(
        "--data",
        choices=["full", "sample"],
        default="full" if os.path.isdir(FULL_DATA) else "sample",
        help="the full debdesc corpus (../shared/data/debdesc; the default when present) or the bundled sample",
    )
    p.add_argument(
        "--examples", type=int, default=256, help="validation pairs to generate for (bart_base; 0: skip)"
    )
    p.add_argument("--gen-batch", type=int, default=32, help="--batch-size of the bart_base generation runs")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument(
        "--seqtrain-bf16",
        action="store_true",
        help="also time seqtrain-train and seqtrain-generate with --bf16",
    )
    p.add_argument(
        "--seqtrain-bf16-fairseq",
        action="store_true",
        help="also time seqtrain-train with --bf16 --bf16-mode fairseq (a bf16 model over fp32 master weights)",
    )
    p.add_argument(
        "--gen-path",
        default=None,
        help="a fairseq checkpoint to generate with (default: the one "
        "fairseq-train saves in the first round)",
    )
    p.add_argument(
        "--small-updates",
        type=int,
        default=0,
        help="also train debdesc_small (configs/debdesc_small.yaml) for this many updates with seqtrain, export "
        "it to fairseq and generate the whole valid split with both tools (batch 64); 0: skip",
    )
    p.add_argument(
        "--profile-updates",
        type=int,
        default=0,
        help="also profile both tools' training (torch.profiler) for this many updates; 0: skip",
    )
    p.add_argument("--skip-train", action="store_true", help="no timed training runs (needs --gen-path)")
    p.add_argument("--workdir", default="/tmp/seqtrain-bench-fairseq")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if not os.path.exists(os.path.join(PEER, "bin", "fairseq-train")):
        print(
            f"bench_fairseq.py: fairseq 0.12 is not installed at {PEER} (install it with "
            "../shared/tools/fairseq-peer.sh, about 10 minutes); nothing to compare with",
            file=sys.stderr,
        )
        return 2
    if args.skip_train and args.examples and not args.gen_path:
        p.error("--skip-train needs --gen-path (or --examples 0)")
    os.makedirs(args.workdir, exist_ok=True)
    databin = ensure_databin(args.workdir, FULL_DATA if args.data == "full" else SAMPLE_DATA)
    threads = torch.get_num_threads()
    peaks = {
        "fp32": measured_matmul_peak(torch.device("cpu"), torch.float32, n=1024),
        "bf16": measured_matmul_peak(torch.device("cpu"), torch.bfloat16, n=1024),
    }
    per_token = flops_per_target_token(databin)
    print(
        f"CPU matmul peak ({threads} threads): fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 "
        f"{peaks['bf16'] / 1e9:.0f} GFLOP/s; {per_token / 1e6:.1f} MFLOP per target token; load "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    args.init = init_weights(args, databin)
    tools = ["seqtrain", "fairseq"] + (["seqtrain-bf16"] if args.seqtrain_bf16 else [])
    tools += ["seqtrain-bf16-fairseq"] if args.seqtrain_bf16_fairseq else []
    train: dict[str, list[dict[str, float]]] = {t: [] for t in tools}
    ckpt_dir = os.path.join(args.workdir, "fairseq-ckpt")
    if not args.skip_train:
        shutil.rmtree(ckpt_dir, ignore_errors=True)  # fairseq-train would resume from a previous run's
    for r in range(0 if args.skip_train else args.rounds):
        for tool in tools if r % 2 == 0 else tools[::-1]:
            save = ckpt_dir if (tool == "fairseq" and r == 0 and args.gen_path is None) else None
            res = train_run(tool, args, databin, args.workdir, f"{tool}-{r}", save)
            train[tool].append(res)
            print(f"train {tool} round {r}: {json.dumps(res)}", flush=True)
    ckpt = args.gen_path or os.path.join(ckpt_dir, "checkpoint_last.pt")
    gen_bin = gen_databin(databin, args.workdir, args.examples)
    gen = (
        {"bart_base": generate_both(args, gen_bin, ckpt, "base", args.gen_batch, [])} if args.examples else {}
    )
    if args.small_updates:
        small = train_small(args, databin)
        gen["debdesc_small"] = generate_both(args, databin, small, "small", 64, SMALL_GEN_FLAGS)
    profiles = profile_both(args, databin) if args.profile_updates else {}
    report = summarize(args, peaks, per_token, train, gen, threads)
    report["profiles"] = profiles
    print(json.dumps(report, indent=1))
    print(table(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


def summarize(
    args: argparse.Namespace,
    peaks: dict[str, float],
    per_token: float,
    train: dict[str, list[dict[str, float]]],
    gen: dict[str, dict[str, list[dict[str, Any]]]],
    threads: int,
) -> dict[str, Any]:
    def best(runs: list[dict[str, Any]], key: str) -> float:
        return max(r[key] for r in runs)

    out: dict[str, Any] = {
        "updates": args.updates,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "threads": threads,
        "load_avg": os.getloadavg()[0],
        "peak_gflops": {k: v / 1e9 for k, v in peaks.items()},
        "mflop_per_target_token": per_token / 1e6,
        "train": {},
        "generate": {},
    }
    for tool, runs in train.items():
        if not runs:  # --skip-train
            continue
        tps = best(runs, "tokens_per_s")
        peak = peaks["bf16" if "bf16" in tool else "fp32"]
        out["train"][tool] = {
            "tokens_per_s": tps,
            "useful_gflops": tps * per_token / 1e9,
            "of_peak": tps * per_token / peak,
            "wall_s": min(r["wall_s"] for r in runs),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
            "peak_pss_gb": max(r["peak_pss_gb"] for r in runs),
            "first_loss": runs[0]["first_loss"],
            "last_loss": runs[0]["last_loss"],
        }
    fs = out["train"].get("fairseq")
    for tool, res in out["train"].items() if fs else []:
        res["speedup_vs_fairseq"] = res["tokens_per_s"] / fs["tokens_per_s"]
        res["memory_vs_fairseq"] = res["peak_rss_gb"] / fs["peak_rss_gb"]
        res["pss_vs_fairseq"] = res["peak_pss_gb"] / fs["peak_pss_gb"]
        ours, theirs = train[tool][0], train["fairseq"][0]
        res["same_batches"] = sum(a == b for a, b in zip(ours["batches"], theirs["batches"]))
        res["mean_loss_rel_diff"] = sum(
            abs(a - b) / abs(b) for a, b in zip(ours["losses"], theirs["losses"])
        ) / max(1, min(len(ours["losses"]), len(theirs["losses"])))
    for model, runs_by_tool in gen.items():
        ref = runs_by_tool["fairseq"][0]["hyps"]
        res_model: dict[str, Any] = {}
        for tool, runs in runs_by_tool.items():
            hyps = runs[0]["hyps"]
            res_model[tool] = {
                "sentences": runs[0]["sentences"],
                "sentences_per_s": best(runs, "sentences_per_s"),
                "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
                "peak_pss_gb": max(r["peak_pss_gb"] for r in runs),
                "identical_to_fairseq": sum(hyps.get(i) == h for i, h in ref.items()),
            }
        fs_gen = res_model["fairseq"]
        for tool, st in res_model.items():
            if tool != "fairseq":
                st["speedup_vs_fairseq"] = st["sentences_per_s"] / fs_gen["sentences_per_s"]
                st["memory_vs_fairseq"] = st["peak_rss_gb"] / fs_gen["peak_rss_gb"]
                st["pss_vs_fairseq"] = st["peak_pss_gb"] / fs_gen["peak_pss_gb"]
        out["generate"][model] = res_model
    return out


def table(report: dict[str, Any]) -> str:
    """The report side by side, as a markdown table."""
    rows = ["| | seqtrain | fairseq 0.12 | seqtrain / fairseq |", "|---|---|---|---|"]

    def row(label: str, a: float, b: float, fmt: str = "{:.1f}") -> None:
        rows.append(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {a / b:.2f}x |")

    peak = report["peak_gflops"]
    for tool, res in report["train"].items():
        if tool == "fairseq":
            continue
        fs = report["train"]["fairseq"]
        row(f"training {tool}: target tokens/s", res["tokens_per_s"], fs["tokens_per_s"])
        row(f"training {tool}: useful GFLOP/s", res["useful_gflops"], fs["useful_gflops"])
        rows.append(
            f"| training {tool}: of the measured peak | {res['of_peak']:.0%} | {fs['of_peak']:.0%} | |"
        )
        rows.append(
            f"| training {tool}: updates with fairseq's batch (size, tokens) | {res['same_batches']} / "
            f"{report['updates']} | | |"
        )
        rows.append(
            f"| training {tool}: mean relative loss difference | {res['mean_loss_rel_diff']:.2e} | | |"
        )
        rows.append(
            f"| training {tool}: loss, first -> last | {res['first_loss']:.3f} -> {res['last_loss']:.3f} "
            f"| {fs['first_loss']:.3f} -> {fs['last_loss']:.3f} | |"
        )
        row(f"training {tool}: process wall s", res["wall_s"], fs["wall_s"])
        row(f"training {tool}: peak RSS GB (process tree)", res["peak_rss_gb"], fs["peak_rss_gb"], "{:.2f}")
        row(f"training {tool}: peak PSS GB (process tree)", res["peak_pss_gb"], fs["peak_pss_gb"], "{:.2f}")
    for model, res in report["generate"].items():
        fs = res["fairseq"]
        for tool, st in res.items():
            if tool == "fairseq":
                continue
            name = model if tool == "seqtrain" else f"{model} {tool}"
            row(f"generation {name}: sentences/s", st["sentences_per_s"], fs["sentences_per_s"], "{:.2f}")
            rows.append(
                f"| generation {name}: best hypotheses identical | {st['identical_to_fairseq']} / "
                f"{fs['sentences']} | | |"
            )
            row(f"generation {name}: peak RSS GB", st["peak_rss_gb"], fs["peak_rss_gb"], "{:.2f}")
            row(f"generation {name}: peak PSS GB", st["peak_pss_gb"], fs["peak_pss_gb"], "{:.2f}")
    rows.append(
        f"\nmeasured matmul peak ({report['threads']} threads): fp32 {peak['fp32']:.0f} GFLOP/s, bf16 "
        f"{peak['bf16']:.1f} GFLOP/s; load average at the end {report['load_avg']:.1f}"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
