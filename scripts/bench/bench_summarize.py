#!/usr/bin/env python
"""Benchmark the three ways to summarize: seqtrain-generate --input, seqtrain.Summarizer.summarize and
seqtrain-interactive, on the same inputs with the same model and flags, side by side in one table.

Each front end runs in this process, in turn, for --rounds rounds (median sentences/s reported). What is timed:
- seqtrain-generate: its own "Generated N sentences ... in Xs" figure (the generation loop with detokenization;
  loading and tokenizing come before it);
- Summarizer.summarize: the whole call (tokenization, batching, generation, detokenization), model loaded once;
- seqtrain-interactive: its own "Generated N sentences in Xs" figure (the reading loop: tokenizing and answering
  each buffer), with --buffer-size 1 (a sentence at a time, as on a terminal), equal to --batch-size, and 4 x
  --batch-size (length-sorting within a buffer packs batches as tightly as seqtrain-generate's global sort only
  when the buffer is larger than a batch).
The target: Summarizer and interactive with full buffers within 10% of seqtrain-generate. A second, steadier
figure on a shared machine: sentences per CPU-second of the whole call (time.process_time; loading the model,
tokenizing, generating and writing, for all three), which does not count time spent waiting for a core.

Model: --path (a seqtrain checkpoint, fairseq model.pt with --data for its dictionary, or a Hugging Face folder);
by default the fairseq-tiny fixture of ../shared (d 128, 2+2 layers) and its data-bin. Inputs: --input (one
document per line), by default that fixture's raw/valid.src repeated to --n lines.

    python scripts/bench/bench_summarize.py                     # fairseq-tiny, 600 sentences, beam 4, 3 rounds
    python scripts/bench/bench_summarize.py --path ck.pt --input docs.txt --n 300 --beam 4 --batch-size 32
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
TINY = os.path.join(os.path.dirname(REPO), "shared", "fixtures", "fairseq-tiny")


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def rate(self) -> float:
        """sentences/s from the last 'Generated N sentences ... in Xs' line."""
        m = re.search(
            r"Generated (\d+) sentences .*?in ([\d.]+)s", [x for x in self.messages if "Generated" in x][-1]
        )
        return int(m.group(1)) / max(float(m.group(2)), 1e-9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", default=os.path.join(TINY, "checkpoint_last.pt"))
    p.add_argument(
        "--data", default=os.path.join(TINY, "data-bin"), help="data-bin for the dictionary ('' none)"
    )
    p.add_argument("--input", default=os.path.join(TINY, "raw", "valid.src"))
    p.add_argument("--n", type=int, default=600, help="sentences (the input lines, repeated or cut)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len-b", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared machine)"
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from seqtrain import Summarizer
    from seqtrain_cli.generate import generate_main
    from seqtrain_cli.interactive import interactive_main

    lines = [x for x in open(a.input, encoding="utf-8").read().split("\n") if x]
    lines = (lines * (a.n // len(lines) + 1))[: a.n]
    tmp = tempfile.mkdtemp(prefix="bench_summarize.")
    inp = os.path.join(tmp, "in.txt")
    with open(inp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    flags = ([a.data] if a.data else []) + ["--path", a.path, "--cpu", "--beam", str(a.beam)]
    flags += ["--max-len-b", str(a.max_len_b), "--batch-size", str(a.batch_size), "--log-format", "none"]
    dict_path = None
    if a.data and os.path.exists(os.path.join(a.data, "dict.src.txt")):
        dict_path = os.path.join(a.data, "dict.src.txt")
    summarizer = Summarizer.from_pretrained(a.path, dict_path=dict_path)
    cap = Capture()
    for name in ("seqtrain.generate", "seqtrain.interactive"):
        logging.getLogger(name).addHandler(cap)
    logging.getLogger().setLevel(logging.INFO)
    rates: dict[str, list[float]] = {}
    outputs: dict[str, list[str]] = {}

    def run_generate() -> float:
        out = io.StringIO()
        generate_main(flags + ["--input", inp], out=out)
        outputs["generate"] = out.getvalue().split("\n")[:-1]
        return cap.rate()

    def run_summarizer() -> float:
        nonlocal summarizer
        summarizer = Summarizer.from_pretrained(
            a.path, dict_path=dict_path
        )  # in the CPU figure, as the CLIs'
        t0 = time.perf_counter()
        outputs["summarize"] = summarizer.summarize(
            lines, beam=a.beam, max_len_b=a.max_len_b, batch_size=a.batch_size, max_tokens=None
        )
        return len(lines) / (time.perf_counter() - t0)

    def run_interactive(buffer: int):
        def run() -> float:
            out = io.StringIO()
            interactive_main(
                flags + ["--buffer-size", str(buffer)], inp=io.StringIO("\n".join(lines)), out=out
            )
            outputs[f"interactive{buffer}"] = out.getvalue().split("\n")[:-1]
            return cap.rate()

        return run

    cases = {
        "seqtrain-generate --input": run_generate,
        "Summarizer.summarize": run_summarizer,
        f"seqtrain-interactive --buffer-size {a.batch_size}": run_interactive(a.batch_size),
        f"seqtrain-interactive --buffer-size {4 * a.batch_size}": run_interactive(4 * a.batch_size),
        "seqtrain-interactive --buffer-size 1": run_interactive(1),
    }
    cpu: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for name, fn in cases.items():
            c0 = time.process_time()
            rates.setdefault(name, []).append(fn())
            cpu.setdefault(name, []).append(len(lines) / (time.process_time() - c0))
    same = all(v == outputs["generate"] for v in outputs.values())
    base = statistics.median(rates["seqtrain-generate --input"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    print(
        f"{len(lines)} sentences, beam {a.beam}, max-len-b {a.max_len_b}, batch size {a.batch_size}, "
        f"{a.threads} torch thread(s), {a.rounds} rounds, model {a.path}; commit {commit.stdout.strip()}; "
        f"load average {os.getloadavg()[0]:.2f}; identical summaries from all: {same}"
    )
    cpu_base = statistics.median(cpu["seqtrain-generate --input"])
    print(
        f"| {'front end':<40} | sentences/s (median) | rounds | vs generate | per CPU-s, end to end | vs generate |"
    )
    print(f"|{'-' * 42}|---|---|---|---|---|")
    for name, r in rates.items():
        med, cmed = statistics.median(r), statistics.median(cpu[name])
        each = ", ".join(f"{x:.0f}" for x in r)
        print(
            f"| {name:<40} | {med:>8.1f} | {each} | {100 * (med / base - 1):+6.1f}% | {cmed:>8.1f} | "
            f"{100 * (cmed / cpu_base - 1):+6.1f}% |"
        )


if __name__ == "__main__":
    main()
