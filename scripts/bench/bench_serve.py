#!/usr/bin/env python
"""Load test of seqtrain-serve against the servers users write by hand, and a soak run; prints a markdown table.

Three real server processes on loopback, each answering POST /v1/summarize {"texts": [...]} with the same model
and search settings, and a real HTTP client here (a thread per concurrent client, each with its own keep-alive
connection, a bounded number of requests of one text each):
- seqtrain-serve: requests batched across clients (--max-batch-tokens, --max-wait-ms);
- summarizer: a FastAPI endpoint calling seqtrain.Summarizer.summarize once per request (a plain `def`
  endpoint: FastAPI runs concurrent requests in its thread pool), behind the same HTTP stack (uvicorn);
- transformers: a FastAPI endpoint calling transformers' generate() per request on the model's
  `seqtrain-convert --to hf` export (the folder itself when --path is a Hugging Face folder).
For each concurrency (1, 8, 32, 128) every round runs the three in turn (the sides alternate inside one run);
the table gives the median over rounds of summaries/s and of the p50 and p99 latency. Every seqtrain-serve
answer is checked against seqtrain-generate's summary of the same text with the same flags.

The soak row: --soak-requests requests (default 2,000) to seqtrain-serve at --soak-concurrency, 5% malformed
(bad JSON, bad UTF-8, an unknown field, an out-of-range setting, no texts: each must get its 400/422), 5% from
clients that send a request and close the connection without reading the answer, the rest 1 to 4 texts with
one of two search settings, every answer checked against seqtrain-generate's; the server's resident memory is
sampled throughout (flat after warm-up: the growth from the sample at 10% of the requests to the end), and the
server must still be alive and exit 0 on SIGTERM.

Model: --path, by default the quickstart's fine-tuned model (.quickstart/checkpoints/checkpoint_best.pt) when
it exists, else the bundled models/debdesc-small-denoising (a Hugging Face folder: the BART pretrained by
denoising, before fine-tuning; it summarizes by rewriting its input, so its summaries run to --max-len-b).
Texts: data/debdesc-sample/test.source. Everything it makes (the export, the reference summaries, logs) goes to
a temporary folder. Servers run with OMP_NUM_THREADS=--threads (default 1: steady on a shared machine).

    python scripts/bench/bench_serve.py                              # the full table and the soak row
    python scripts/bench/bench_serve.py --concurrency 1 8 --rounds 1 --soak-requests 0   # a quick look
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(REPO, ".quickstart", "checkpoints", "checkpoint_best.pt")
BUNDLED = os.path.join(REPO, "models", "debdesc-small-denoising")
TEXTS = os.path.join(REPO, "data", "debdesc-sample", "test.source")
OTHER = {"beam": 2, "lenpen": 0.8, "max_len_b": 20}  # the soak's second search setting


# ------------------------------------------------------------------------------------ the hand-written servers
def run_baseline(kind: str, path: str, port: int, s: argparse.Namespace) -> None:
    """The server a user writes: FastAPI, a plain `def` endpoint, one library call per request."""
    import uvicorn  # the baseline servers' own process only
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Request(BaseModel):
        texts: list[str]

    if kind == "summarizer":
        from seqtrain import Summarizer  # the baseline servers' own process only

        model = Summarizer.from_pretrained(
            path, model_overrides={"max_source_positions": s.max_source_positions}
        )
        flags = dict(beam=s.beam, max_len_b=s.max_len_b, no_repeat_ngram_size=s.no_repeat_ngram_size)

        def summarize(texts: list[str]) -> list[str]:
            return model.summarize(texts, **flags)

    else:
        import torch  # the baseline servers' own process only
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        # the class the export names (a pre-norm model, as the quickstart's, is an MBartForConditionalGeneration:
        # BART's class would drop its final layer norms)
        hf = AutoModelForSeq2SeqLM.from_pretrained(path).eval()

        def summarize(texts: list[str]) -> list[str]:
            inputs = tok(
                texts, return_tensors="pt", padding=True, truncation=True, max_length=s.max_source_positions
            )
            with torch.no_grad():
                out = hf.generate(
                    **inputs,
                    num_beams=s.beam,
                    max_length=s.max_len_b + 2,
                    no_repeat_ngram_size=s.no_repeat_ngram_size,
                    early_stopping=True,
                )
            return tok.batch_decode(out, skip_special_tokens=True)

    app = FastAPI()

    @app.post("/v1/summarize")
    def endpoint(req: Request) -> dict:
        return {"summaries": summarize(req.texts)}

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "alive"}

    summarize(["warm up"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ------------------------------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(argv: list[str], port: int, log: str, threads: int, cpus: set[int] | None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=REPO)
    pin = None if cpus is None else lambda: os.sched_setaffinity(0, cpus)
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, preexec_fn=pin)
    end = time.monotonic() + 300
    while True:
        try:
            if post(port, "GET", "/healthz", None)[0] == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"server did not start: {' '.join(argv)}\n{open(log).read()[-3000:]}")
        time.sleep(0.2)


def post(port: int, method: str, path: str, body: bytes | None, conn=None) -> tuple[int, bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        if own:
            conn.close()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def references(path: str, texts: list[str], flags: list[str], tmp: str, name: str) -> dict[str, str]:
    """seqtrain-generate's summary of each text with these flags."""
    src, out = os.path.join(tmp, f"{name}.txt"), os.path.join(tmp, f"{name}.out")
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "seqtrain_cli.generate",
        "--path",
        path,
        *flags,
        "--input",
        src,
        "--output",
        out,
    ]
    subprocess.run(cmd, check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True)
    with open(out, encoding="utf-8") as f:
        return dict(zip(texts, f.read().split("\n")))


def load(clients: int, port: int, texts: list[str], n: int) -> tuple[float, list[float], list]:
    """`n` requests of one text from `clients` closed-loop clients: (seconds, latencies, (text, status, body))."""
    lock, next_i, lat, answers = threading.Lock(), [0], [], []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n:
                break
            text = texts[i % len(texts)]
            t0 = time.perf_counter()
            status, body = post(port, "POST", "/v1/summarize", json.dumps({"texts": [text]}).encode(), conn)
            with lock:
                lat.append(time.perf_counter() - t0)
                answers.append((text, status, body))
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat, answers


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


# ------------------------------------------------------------------------------------------------- the soak
MALFORMED = [
    (b'{"texts": ["a text"', 400),
    (b'{"texts": ["a \xff text"]}', 400),
    (b'{"texts": ["a text"], "model": "other"}', 422),
    (b'{"texts": ["a text"], "beam": 0}', 422),
    (b'{"texts": []}', 422),
]


def soak(port: int, pid: int, texts: list[str], refs: dict, a: argparse.Namespace) -> dict:
    rng = random.Random(0)
    plan = []
    for _ in range(a.soak_requests):
        r = rng.random()
        if r < 0.05:
            plan.append(("malformed", rng.choice(MALFORMED)))
        elif r < 0.10:
            plan.append(("disconnect", [rng.choice(texts)]))
        else:
            which = rng.choice(("default", "other"))
            plan.append((which, rng.sample(texts, rng.randint(1, 4))))
    lock, state = threading.Lock(), {"next": 0, "wrong": 0, "lost": 0, "bad_status": 0, "ok": 0, "rss": []}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= len(plan):
                break
            kind, what = plan[i]
            if i % 50 == 0:
                with lock:
                    state["rss"].append((i, rss_mib(pid)))
            if kind == "disconnect":
                body = json.dumps({"texts": what}).encode()
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    sock.sendall(
                        b"POST /v1/summarize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                    )
                continue
            if kind == "malformed":
                status, _ = post(port, "POST", "/v1/summarize", what[0], conn)
                with lock:
                    state["bad_status"] += status != what[1]
                continue
            payload = {"texts": what, **(OTHER if kind == "other" else {})}
            status, body = post(port, "POST", "/v1/summarize", json.dumps(payload).encode(), conn)
            with lock:
                if status != 200:
                    state["lost"] += 1
                elif json.loads(body)["summaries"] != [refs[kind][t] for t in what]:
                    state["wrong"] += 1
                else:
                    state["ok"] += 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(a.soak_concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state["seconds"] = time.perf_counter() - t0
    state["rss"].append((len(plan), rss_mib(pid)))
    state["kinds"] = {
        k: sum(1 for p in plan if p[0] == k) for k in ("default", "other", "malformed", "disconnect")
    }
    return state


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", default=QUICKSTART if os.path.exists(QUICKSTART) else BUNDLED)
    p.add_argument(
        "--concurrency", type=int, nargs="*", default=[1, 8, 32, 128], help="(none: the soak only)"
    )
    p.add_argument("--requests", type=int, default=64, help="requests per cell: max(this, 2 x concurrency)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every server")
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run every server on the same --threads CPUs (sched_setaffinity), so a server answering requests "
        "in several threads at once (FastAPI runs a plain def endpoint in a thread pool) gets no more cores "
        "than one that batches them (default: on)",
    )
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-len-b", type=int, default=30)
    p.add_argument("--no-repeat-ngram-size", type=int, default=3)
    p.add_argument("--max-source-positions", type=int, default=48)
    p.add_argument("--sides", nargs="+", default=["seqtrain-serve", "summarizer", "transformers"])
    p.add_argument("--serve-args", default="", help="more seqtrain-serve flags, e.g. '--max-wait-ms 20'")
    p.add_argument("--soak-requests", type=int, default=2000)
    p.add_argument("--soak-concurrency", type=int, default=32)
    p.add_argument("--serve-baseline", choices=["summarizer", "transformers"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_baseline:
        run_baseline(a.serve_baseline, a.path, a.port, a)
        return
    search = [
        "--cpu",
        "--beam", str(a.beam),
        "--max-len-b", str(a.max_len_b),
        "--no-repeat-ngram-size", str(a.no_repeat_ngram_size),
        "--max-source-positions", str(a.max_source_positions),
    ]  # fmt: skip
    with open(TEXTS, encoding="utf-8") as f:
        texts = [t for t in f.read().split("\n") if t]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), "?")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}; {cpu}, {os.cpu_count()} CPUs; commit {commit.stdout.strip()}"
    )
    pinned = f", pinned to {a.threads} CPU{'s' if a.threads > 1 else ''}" if a.pin else ""
    print(f"# model {os.path.relpath(a.path, REPO)}; {' '.join(search)}; server threads {a.threads}{pinned}")
    print(f"# command: python scripts/bench/bench_serve.py {' '.join(sys.argv[1:])}")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_serve.") as tmp:
        refs = {
            "default": references(a.path, texts, search, tmp, "default"),
            "other": references(
                a.path, texts, search + [f for k, v in OTHER.items() for f in (f"--{k.replace('_', '-')}", str(v))],
                tmp, "other",
            ),
        }  # fmt: skip
        hf = a.path
        if "transformers" in a.sides and not os.path.isdir(a.path):
            hf = os.path.join(tmp, "hf")
            convert = [sys.executable, "-m", "seqtrain_cli.convert", a.path, hf, "--to", "hf"]
            subprocess.run(convert, check=True, cwd=REPO, capture_output=True)
        servers, ports = {}, {}
        cpus = set(sorted(os.sched_getaffinity(0))[: a.threads]) if a.pin else None
        try:
            for side in a.sides:
                port = ports[side] = free_port()
                log = os.path.join(tmp, f"{side}.log")
                if side == "seqtrain-serve":
                    argv = [
                        sys.executable,
                        "-m",
                        "seqtrain_cli.serve",
                        "--path",
                        a.path,
                        *search,
                        "--port",
                        str(port),
                    ]
                    argv += ["--no-access-log", "--max-queue", "4096", "--max-text-chars", "1000000"]
                    argv += a.serve_args.split()
                else:
                    me = [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--serve-baseline",
                        side,
                        "--port",
                        str(port),
                    ]
                    argv = (
                        me
                        + ["--path", hf if side == "transformers" else a.path]
                        + [
                            f"--{k}={getattr(a, k.replace('-', '_'))}"
                            for k in ("beam", "max-len-b", "no-repeat-ngram-size", "max-source-positions")
                        ]
                    )
                servers[side] = start(argv, port, log, a.threads, cpus)
            if a.concurrency:
                try:
                    table(a, texts, refs, ports)
                except AssertionError:  # a server answered other than 200: its log says why
                    for side in servers:
                        tail = open(os.path.join(tmp, f"{side}.log"), errors="replace").read()[-4000:]
                        print(f"# {side}'s log, last lines:\n{tail}", flush=True)
                    raise
            if a.soak_requests and "seqtrain-serve" in servers:
                report_soak(a, texts, refs, ports["seqtrain-serve"], servers["seqtrain-serve"])
        finally:
            for proc in servers.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for side, proc in servers.items():
                code = proc.wait(timeout=120)
                if side == "seqtrain-serve" and code != 0:
                    print(f"# seqtrain-serve exited {code} on SIGTERM", flush=True)
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")


def batches(port: int) -> tuple[float, float]:
    """seqtrain-serve's (texts summarized, batches run) so far, from its /metrics."""
    text = post(port, "GET", "/metrics", None)[1].decode()
    done = re.search(r"^seqtrain_serve_summaries_total (\S+)$", text, re.M)
    runs = re.search(r"^seqtrain_serve_batch_size_count (\S+)$", text, re.M)
    return float(done.group(1)), float(runs.group(1))


def table(a: argparse.Namespace, texts: list[str], refs: dict, ports: dict) -> None:
    cells: dict = {}
    wrong = 0
    for conc in a.concurrency:
        n = max(a.requests, 2 * conc)
        for r in range(a.rounds):
            for side in a.sides:
                start_at = r * 7919 % len(texts)  # each round other texts, the same for every side
                order = texts[start_at:] + texts[:start_at]
                before = batches(ports[side]) if side == "seqtrain-serve" else None
                seconds, lat, answers = load(conc, ports[side], order, n)
                assert all(status == 200 for _, status, _ in answers), [x for x in answers if x[1] != 200][:3]
                mean = float("nan")
                if side == "seqtrain-serve":
                    wrong += sum(
                        json.loads(body)["summaries"] != [refs["default"][t]] for t, _, body in answers
                    )
                    after = batches(ports[side])
                    mean = (after[0] - before[0]) / max(after[1] - before[1], 1)
                cells.setdefault((side, conc), []).append((n / seconds, pct(lat, 0.5), pct(lat, 0.99), mean))
                print(
                    f"#   {side} c={conc} round {r + 1}: {n / seconds:.1f}/s, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    print(
        "\n| server | concurrency | requests | summaries/s | p50 latency (s) | p99 latency (s) | texts per batch |",
        end="",
    )
    print(" vs summarizer | vs transformers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for conc in a.concurrency:
        med = {s: [statistics.median(x[i] for x in cells[(s, conc)]) for i in range(4)] for s in a.sides}
        for side in a.sides:
            rate, p50, p99, mean = med[side]
            vs = [
                f"{rate / med[b][0]:.2f}x" if b in med and b != side else ""
                for b in ("summarizer", "transformers")
            ]
            n = max(a.requests, 2 * conc)
            per = f"{mean:.1f}" if side == "seqtrain-serve" else "1 (one request)"
            row = [side, conc, f"{n} x {a.rounds}", f"{rate:.1f}", f"{p50:.3f}", f"{p99:.3f}", per, *vs]
            print("| " + " | ".join(map(str, row)) + " |")
    print(f"\nseqtrain-serve answers that differ from seqtrain-generate's: {wrong}", flush=True)


def report_soak(
    a: argparse.Namespace, texts: list[str], refs: dict, port: int, proc: subprocess.Popen
) -> None:
    s = soak(port, proc.pid, texts, refs, a)
    rss = s["rss"]
    warm = next((m for i, m in rss if i >= a.soak_requests // 10), rss[0][1])
    alive = proc.poll() is None and post(port, "GET", "/healthz", None)[0] == 200
    print(
        f"\nsoak: {a.soak_requests} requests at concurrency {a.soak_concurrency} in {s['seconds']:.0f} s "
        f"({s['kinds']['default'] + s['kinds']['other']} well-formed, {s['kinds']['malformed']} malformed, "
        f"{s['kinds']['disconnect']} disconnecting): {s['ok']} answered correctly, {s['wrong']} wrong, "
        f"{s['lost']} lost, {s['bad_status']} malformed with another status than expected; RSS after warm-up "
        f"{warm:.0f} MiB, at the end {rss[-1][1]:.0f} MiB (max {max(m for _, m in rss):.0f}); "
        f"server {'alive' if alive else 'DEAD'}",
        flush=True,
    )
    tenth = max(1, len(rss) // 10)
    trace = ", ".join(
        f"{i}: {m:.0f}" for i, m in rss[::tenth] + ([rss[-1]] if (len(rss) - 1) % tenth else [])
    )
    print(f"soak: RSS (MiB) after N requests: {trace}")
    m = re.search(r'code="499"\} (\d+)', post(port, "GET", "/metrics", None)[1].decode())
    print(f"soak: the server counted {m.group(1) if m else 0} requests whose client left first (499)")


if __name__ == "__main__":
    main()
