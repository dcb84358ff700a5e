#!/usr/bin/env python
"""Fine-tuning the bundled pretrained model on your own pairs, measured at four sizes: 500, 1,000, 2,000 and 5,000
held-out debdesc pairs, each run scored on the same 500 test pairs no run saw (docs/quality.md, "Your own pairs").

    python scripts/quality/finetune_sizes.py                      # --corpus ../shared/data/debdesc; ~2-3 h on 2 cores
    python scripts/quality/finetune_sizes.py --sizes 500,2000 --systems recipe,lead
    python scripts/quality/finetune_sizes.py --table              # print the table of the runs done so far

Needs the full debdesc corpus (train and valid splits): `../shared/data/debdesc` beside the repository, which a
user's clone does not have; give another copy with --corpus. Nothing of the bundled sample (data/debdesc-sample)
is used, and nothing of the corpus' held-out test split (it is not in the corpus folder). The draws, seeded:
- train: the corpus' train pairs that are not in the bundled sample's train split (scripts/dev/make_sample.py drew
  those as random.Random(0).sample(range(53,332), 5000)): 48,332 pairs, shuffled with random.Random(50); size N
  takes the first N, so each set holds the smaller ones;
- test: the corpus' valid split permuted as make_sample.py permutes it (random.Random(1).shuffle of its indices;
  positions 0-299 are the sample's valid split, 300-599 its test split): positions 600-1,099, 500 pairs;
- validation (what the runs select checkpoints on): positions 1,100-1,399, 300 pairs, the same at every size.
The corpus splits by source package, so no test pair shares a source package with a train pair; validation and
test pairs may.

Systems, each on the test pairs with the preset's generation settings (beam 4, max-len-b 30, no repeated
trigrams):
- lead: the lead baseline (scripts/quality/lead_baseline.py: the first sentence, cut to 12 words);
- bundled: models/debdesc-small-denoising as it is, no fine-tuning (a denoiser: it rebuilds its input);
- today: the README's own-data commands before the recipe (configs/debdesc_small.yaml, --lr 0.0005
  --warmup-updates 60 --max-update 800, checkpoint_best.pt chosen by validation loss);
- recipe: `--config configs/debdesc_finetune.yaml` (the README's own-data command now).
Each training starts from the bundled model in a fresh save dir, with OMP_NUM_THREADS=--threads (1: the machine
is shared); its CPU time is the process's user + system time (os.wait4), not the wall clock. The paired
bootstrap tests are seqtrain-eval --compare's (1,000 resamples, seed 1). Everything goes under --work
(.finetune-sizes/, git-ignored): raw/, bin/, runs/SIZE/SYSTEM/ (checkpoints, train.log, gen/, eval-*.json,
result.json). A rerun skips the runs whose result.json exists (delete a run's folder to redo it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAINED = os.path.join(REPO, "models", "debdesc-small-denoising")
SIZES = (500, 1000, 2000, 5000)
SYSTEMS = ("lead", "bundled", "today", "recipe")
CORPUS_TRAIN = 53332
# the training commands compared (the data-bin, --save-dir and logging flags are added per run)
TRAIN_FLAGS = {
    "today": [
        "--config",
        "configs/debdesc_small.yaml",
        "--finetune-from-model",
        "models/debdesc-small-denoising",
        "--lr",
        "0.0005",
        "--warmup-updates",
        "60",
        "--max-update",
        "800",
    ],
    "recipe": [
        "--config",
        "configs/debdesc_finetune.yaml",
        "--finetune-from-model",
        "models/debdesc-small-denoising",
    ],
}
# every system's summaries: the preset's generation settings, given explicitly so that all four decode alike
GENERATE_FLAGS = ["--config", "configs/debdesc_small.yaml", "--batch-size", "64"]


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def draw(corpus: str) -> dict[str, dict[str, list[int]]]:
    """The corpus indices of every split: {"train": {"train": [...]} per size, "valid": ..., "test": ...}."""
    n_train = len(read_lines(os.path.join(corpus, "train.target")))
    if n_train != CORPUS_TRAIN:
        raise SystemExit(
            f"finetune_sizes.py: error: {corpus}/train.target has {n_train} lines, not {CORPUS_TRAIN}"
        )
    sample = set(random.Random(0).sample(range(n_train), 5000))  # as scripts/dev/make_sample.py
    pool = [i for i in range(n_train) if i not in sample]
    random.Random(50).shuffle(pool)
    valid = list(range(len(read_lines(os.path.join(corpus, "valid.target")))))
    random.Random(1).shuffle(valid)  # as scripts/dev/make_sample.py: [0:300] its valid, [300:600] its test
    return {
        "pool": pool,
        "valid": sorted(valid[1100:1400]),
        "test": sorted(valid[600:1100]),
    }


def prepare(corpus: str, work: str, sizes: list[int]) -> None:
    """raw/SIZE/{train,valid,test}.{source,target} and bin/SIZE (the pretrained model's tokenizer and
    dictionary), each made once."""
    picks = draw(corpus)
    text = {
        (split, side): read_lines(os.path.join(corpus, f"{split}.{side}"))
        for split in ("train", "valid")
        for side in ("source", "target")
    }
    for n in sizes:
        raw, binned = os.path.join(work, "raw", str(n)), os.path.join(work, "bin", str(n))
        if not os.path.exists(os.path.join(raw, "test.target")):
            os.makedirs(raw, exist_ok=True)
            splits = {"train": ("train", sorted(picks["pool"][:n])), "valid": ("valid", picks["valid"])}
            splits["test"] = ("valid", picks["test"])
            for split, (origin, idx) in splits.items():
                for side in ("source", "target"):
                    with open(os.path.join(raw, f"{split}.{side}"), "w", encoding="utf-8") as f:
                        f.writelines(text[origin, side][i] + "\n" for i in idx)
        if not os.path.exists(os.path.join(binned, "preprocess.json")):
            shutil.rmtree(binned, ignore_errors=True)
            run(
                [
                    "seqtrain-preprocess",
                    "--trainpref",
                    f"{raw}/train",
                    "--validpref",
                    f"{raw}/valid",
                    "--testpref",
                    f"{raw}/test",
                    "--destdir",
                    binned,
                    "--joined-dictionary",
                    "--spm-model",
                    os.path.join(PRETRAINED, "spm.model"),
                    "--srcdict",
                    os.path.join(PRETRAINED, "dict.txt"),
                    "--workers",
                    "1",
                ],
                os.path.join(work, "raw", f"preprocess-{n}.log"),
            )


def tool(name: str) -> str:
    """A seqtrain console script of the interpreter running this file (its venv), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.path.exists(here) else name


def run(cmd: list[str], log: str, threads: int = 1) -> float:
    """Run `cmd` (its output to `log`) in the repository root; returns its CPU seconds (user + system, its
    children included). A failure stops the script with the log's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [tool(cmd[0]), *cmd[1:]], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        with open(log, encoding="utf-8") as f:
            tail = "".join(f.readlines()[-15:])
        raise SystemExit(f"{tail}\nfinetune_sizes.py: error: {' '.join(cmd[:2])} ... failed (log: {log})")
    return usage.ru_utime + usage.ru_stime


def train_summary(log: str) -> dict:
    """From a training log: updates done, the best checkpoint line, the rule that chose it, training seconds."""
    out: dict = {}
    with open(log, encoding="utf-8") as f:
        for line in f:
            if "| seqtrain.train | best checkpoint:" in line:
                out["best"] = line.split("best checkpoint: ", 1)[1].strip()
            if "| seqtrain.train | checkpoint_best.pt" in line or "chose checkpoint_best.pt" in line:
                out["rule"] = line.split("| seqtrain.train | ", 1)[1].strip()
            if "done training in" in line:
                out["train_seconds"] = float(line.split("done training in ", 1)[1].split()[0])
            if "num_updates" in line and "| valid |" in line:
                out["updates"] = int(line.split("num_updates ")[1].split()[0])
    return out


def evaluate(work: str, n: int, hyps: str, name: str, compare: dict[str, str], folder: str) -> dict:
    """ROUGE with intervals, and the paired test against each of `compare` (name -> hypotheses), by
    seqtrain-eval --compare."""
    raw = os.path.join(work, "raw", str(n))
    out: dict = {}
    for other, other_hyps in {"": None, **compare}.items():
        report = os.path.join(folder, f"eval-{other or 'self'}.json")
        cmd = [
            "seqtrain-eval",
            "--hyps",
            hyps,
            "--source",
            f"{raw}/test.source",
            "--reference",
            f"{raw}/test.target",
        ]
        cmd += ["--json", report] + (["--compare", other_hyps] if other_hyps else [])
        run(cmd, report + ".log")
        with open(report, encoding="utf-8") as f:
            r = json.load(f)
        if not other:
            out["rouge"] = {k: r["rouge"][k] for k in ("rouge1", "rouge2", "rougeLsum")}
            out["ci"] = r["rouge"]["ci"]
        else:
            out[f"vs_{other}"] = r["compare"]["test"]["rougeLsum"]
    return out


def hypotheses(work: str, n: int, system: str) -> str:
    return os.path.join(work, "runs", str(n), system, "gen", "hypotheses-test.txt")


def run_system(work: str, n: int, system: str, threads: int, done: dict) -> dict:
    folder = os.path.join(work, "runs", str(n), system)
    os.makedirs(folder, exist_ok=True)
    binned, raw = os.path.join(work, "bin", str(n)), os.path.join(work, "raw", str(n))
    result: dict = {"size": n, "system": system}
    if system == "lead":
        os.makedirs(os.path.join(folder, "gen"), exist_ok=True)
        cmd = [
            "python",
            "scripts/quality/lead_baseline.py",
            f"{raw}/test",
            "--hypotheses",
            hypotheses(work, n, system),
        ]
        run([sys.executable, *cmd[1:]], os.path.join(folder, "lead.log"))
    else:
        path = PRETRAINED
        if system in TRAIN_FLAGS:
            save = os.path.join(folder, "checkpoints")
            shutil.rmtree(save, ignore_errors=True)
            log = os.path.join(folder, "train.log")
            cmd = [
                "seqtrain-train",
                binned,
                *TRAIN_FLAGS[system],
                "--save-dir",
                save,
                "--log-format",
                "simple",
            ]
            start = time.time()
            result["train_cpu_s"] = run(cmd + ["--log-interval", "50", "--no-progress-bar"], log, threads)
            result["train_wall_s"] = time.time() - start
            result["train_flags"] = TRAIN_FLAGS[system]
            result.update(train_summary(log))
            path = os.path.join(save, "checkpoint_best.pt")
        gen = ["seqtrain-generate", binned, *GENERATE_FLAGS, "--path", path, "--gen-subset", "test"]
        gen += ["--quiet", "--scoring", "rouge", "--results-path", os.path.join(folder, "gen")]
        result["generate_cpu_s"] = run(gen, os.path.join(folder, "generate.log"), threads)
    compare = {s: hypotheses(work, n, s) for s in ("lead", "bundled", "today") if s != system and s in done}
    result.update(evaluate(work, n, hypotheses(work, n, system), system, compare, folder))
    with open(os.path.join(folder, "result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return result


def load_results(work: str) -> dict[tuple[int, str], dict]:
    out = {}
    for n in SIZES:
        for system in SYSTEMS:
            path = os.path.join(work, "runs", str(n), system, "result.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    out[n, system] = json.load(f)
    return out


def test_text(t: dict | None) -> str:
    if not t:
        return ""
    p = "p < 0.001" if t["p_value"] == 0 else f"p {t['p_value']:.3f}"  # 1,000 resamples: 0 is below 1/1000
    return f"{t['delta']:+.2f} ({p})"


def table(results: dict[tuple[int, str], dict]) -> str:
    """The markdown table of docs/quality.md: lead and the bundled model once (they do not depend on the train
    size: the same test pairs), then the two trainings at each size."""
    rows = [
        "| train pairs | system | ROUGE-1 | ROUGE-2 | ROUGE-Lsum [95% CI] | Lsum vs lead | vs today's | "
        "vs bundled | updates (best) | CPU min |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    shown = set()
    for n in SIZES:
        for system in SYSTEMS:
            r = results.get((n, system))
            if r is None or system in shown:
                continue
            if system in ("lead", "bundled"):
                shown.add(system)
            lo, hi = r["ci"]["rougeLsum"]
            cpu = f"{r['train_cpu_s'] / 60:.1f}" if "train_cpu_s" in r else ""
            best = r.get("best", "")
            where = best.split("update ")[1].split(",")[0] if "update " in best else ""
            updates = f"{r.get('updates', '')} ({where})" if "updates" in r else ""
            rouge = r["rouge"]
            size = "any" if system in shown else f"{n:,}"
            rows.append(
                f"| {size} | {system} | {rouge['rouge1']:.2f} | {rouge['rouge2']:.2f} | "
                f"{rouge['rougeLsum']:.2f} [{lo:.2f}, {hi:.2f}] | {test_text(r.get('vs_lead'))} | "
                f"{test_text(r.get('vs_today'))} | {test_text(r.get('vs_bundled'))} | {updates} | {cpu} |"
            )
    return "\n".join(rows) + "\n"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--corpus",
        default=os.path.join(REPO, "..", "shared", "data", "debdesc"),
        help="the debdesc corpus folder (train.* and valid.*; default: ../shared/data/debdesc)",
    )
    p.add_argument("--work", default=os.path.join(REPO, ".finetune-sizes"), help="where everything goes")
    p.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="train sizes (default: 500,1000,2000,5000)"
    )
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"among {', '.join(SYSTEMS)} (default: all)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run (default: 1)")
    p.add_argument("--table", action="store_true", help="only print the table of the runs done")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if not args.table:
        if not os.path.isfile(os.path.join(args.corpus, "train.source")):
            print(
                f"finetune_sizes.py: error: no debdesc corpus at {args.corpus} (the full corpus lives in "
                "../shared/data/debdesc beside the repository; give another copy with --corpus)",
                file=sys.stderr,
            )
            return 1
        prepare(args.corpus, args.work, sizes)
        for n in sizes:
            for system in systems:
                done = {s for (m, s) in load_results(args.work) if m == n}
                if system in done:
                    continue
                print(f"[{datetime.datetime.now():%H:%M:%S}] size {n}: {system} ...", flush=True)
                r = run_system(args.work, n, system, args.threads, done)
                cpu = f", training {r['train_cpu_s'] / 60:.1f} CPU min" if "train_cpu_s" in r else ""
                print(f"  ROUGE-Lsum {r['rouge']['rougeLsum']:.2f}{cpu}", flush=True)
    results = load_results(args.work)
    load = os.getloadavg()[0]
    print(f"\n{cpu_model()}, {datetime.date.today()}, --threads {args.threads}, load average now {load:.1f}")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
