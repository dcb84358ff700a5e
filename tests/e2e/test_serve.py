"""seqtrain-serve as a user runs it: a real server process on a free loopback port, real HTTP requests.

The answers equal seqtrain-generate's for the same checkpoint, texts and settings, whatever they were batched
with; each limit and fault answers its JSON error with the right status and leaves the others undisturbed; the
server drains on SIGTERM and exits 0. The server runs the real model; a small launcher adds two faults to its
batch step that the tests trigger by a marker text (a batch that raises, a batch that takes seconds), since
neither happens on demand otherwise."""

from __future__ import annotations

import http.client
import io
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from seqtrain_cli.generate import generate_main
from seqtrain_cli.train import train_main
from tests.utils import REPO, base_args

pytestmark = pytest.mark.slow

FLAGS = ["--cpu", "--beam", "3", "--max-len-b", "8", "--max-source-positions", "12"]
OTHER = {"beam": 2, "lenpen": 0.5, "min_len": 2, "max_len_b": 6, "no_repeat_ngram_size": 2, "nbest": 2}
FAIL = "w7 w7 w7 w7 w7"  # a text starting so makes its batch raise


def slow_text(seconds: float) -> str:
    """A text whose batch sleeps `seconds` (0.5 s per w8) before generating."""
    return " ".join(["w8"] * int(seconds * 2))


LAUNCHER = f"""
import sys, time
from seqtrain.serve import batcher
run = batcher.Batcher.generate_batch
def faulty(self, batch):
    texts = [self.loaded.lm.src_dict.string(it.source) for it in batch]
    if any(t.startswith({FAIL!r}) for t in texts):
        raise RuntimeError("injected fault")
    naps = [0.5 * t.split().count("w8") for t in texts if t.startswith("w8 w8 w8")]
    time.sleep(max(naps, default=0))
    return run(self, batch)
batcher.Batcher.generate_batch = faulty
sys.argv[0] = "seqtrain-serve"
from seqtrain_cli.serve import cli_main
cli_main(sys.argv[1:])
"""
TOKEN = "s3cret-token"


class Server:
    def __init__(self, proc: subprocess.Popen, log: pathlib.Path, port: int):
        self.proc, self.log, self.port = proc, log, port

    def request(
        self, method: str, path: str, body: bytes | dict | None = None, token: str | None = TOKEN, timeout=60
    ) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def summarize(self, payload: dict | bytes, **kw) -> tuple[int, dict]:
        status, _, data = self.request("POST", "/v1/summarize", payload, **kw)
        return status, json.loads(data)

    def metrics(self) -> dict[str, float]:
        status, headers, data = self.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        return parse_prometheus(data.decode())

    def wait_for(self, name: str, value: float, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while self.metrics().get(name) != value:
            assert time.monotonic() < end, f"{name} never reached {value}: {self.metrics().get(name)}"
            time.sleep(0.02)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus' text format: 'name{labels} value' lines (comments start with #), each name and label set once."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert re.match(r"# (HELP|TYPE) \w+ ", line) or not line, line
            continue
        name, value = re.fullmatch(r"(\w+(?:\{[^}]*\})?) (\S+)", line).groups()
        assert name not in out, name
        out[name] = float(value)
    return out


def start(ck: str, tmp: pathlib.Path, *flags: str) -> Server:
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    (tmp / "key").write_text(TOKEN + "\n")
    argv = ["--path", ck, *FLAGS, "--port", "0", "--api-key-file", str(tmp / "key"), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, *argv], stdout=f, stderr=f, cwd=REPO, env=env
        )
    end = time.monotonic() + 120
    while True:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return Server(proc, log, int(m.group(1)))
        assert proc.poll() is None, log.read_text()
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"no 'listening on' line in 120 s:\n{log.read_text()}")
        time.sleep(0.05)


def stop(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def checkpoint(toy_databin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ck"))
    args = base_args(
        toy_databin(), save, "--max-update", "30", "--no-epoch-checkpoints", "--no-save-optimizer-state"
    )
    assert train_main(args) == 0
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def texts(toy_databin):
    raw = pathlib.Path(toy_databin()).parent / "raw"
    lines = (raw / "valid.src").read_text().split("\n")[:10]
    return lines + [" ".join(f"w{i % 30}" for i in range(20)), "w3"]  # one cut to 12 positions, one short


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    s = start(
        checkpoint,
        tmp_path_factory.mktemp("serve"),
        "--max-wait-ms",
        "30",
        "--max-texts",
        "6",
        "--max-queue",
        "24",
        "--max-text-chars",
        "300",
        "--max-request-bytes",
        "2000",
        "--max-beam",
        "4",
        "--request-timeout",
        "4",
    )
    yield s
    assert stop(s) == 0, s.log.read_text()[-3000:]


def generated(checkpoint, texts, tmp_path, settings: dict) -> list[list[tuple[float, str]]]:
    """seqtrain-generate's D- lines (base-2 score, summary) per text, best first."""
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    flags = [f for k, v in settings.items() for f in (f"--{k.replace('_', '-')}", str(v))]
    out = io.StringIO()
    generate_main(
        [
            "--path",
            checkpoint,
            *FLAGS,
            *flags,
            "--input",
            str(tmp_path / "in.txt"),
            "--output-format",
            "fairseq",
        ],
        out=out,
    )
    hyps: dict[int, list] = {}
    for line in out.getvalue().splitlines():
        if line.startswith("D-"):
            sid, score, text = line[2:].split("\t")
            hyps.setdefault(int(sid), []).append((float(score), text))
    return [hyps[i] for i in range(len(texts))]


def test_answers_are_seqtrain_generates_whatever_they_were_batched_with(server, checkpoint, texts, tmp_path):
    want = {
        "default": generated(checkpoint, texts, tmp_path, {}),
        "other": generated(checkpoint, texts, tmp_path, OTHER),
    }
    before = server.metrics()
    # 12 texts x 2 settings in requests of 1 to 3 texts, all at once: batches mix requests and lengths
    jobs = []
    for which in ("default", "other"):
        for lo in range(0, len(texts), 3):
            idx = list(range(lo, min(lo + (1 + lo // 3 % 3), len(texts))))
            jobs.append((which, idx))
    covered = {(w, i) for w, idx in jobs for i in idx}
    jobs += [(w, [i]) for w in ("default", "other") for i in range(len(texts)) if (w, i) not in covered]
    answers: dict[int, tuple] = {}

    def send(j: int, which: str, idx: list[int]) -> None:
        payload = {"texts": [texts[i] for i in idx], **(OTHER if which == "other" else {})}
        answers[j] = server.summarize(payload)

    threads = [threading.Thread(target=send, args=(j, *job)) for j, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for j, (which, idx) in enumerate(jobs):
        status, body = answers[j]
        assert status == 200, body
        for i, result in zip(idx, body["results"]):
            expect = want[which][i]
            got = [(h["score"], h["summary"]) for h in result["hypotheses"]]
            assert [t for _, t in got] == [t for _, t in expect], (which, texts[i])
            assert [s for s, _ in got] == pytest.approx(
                [s for s, _ in expect], abs=1e-4
            )  # D- prints 4+ digits
            assert result["truncated"] == (len(texts[i].split()) + 1 > 12)
        assert body["summaries"] == [want[which][i][0][1] for i in idx]
        assert body["settings"]["beam"] == (2 if which == "other" else 3)
    after = server.metrics()
    done = after["seqtrain_serve_summaries_total"] - before["seqtrain_serve_summaries_total"]
    batches = after["seqtrain_serve_batch_size_count"] - before["seqtrain_serve_batch_size_count"]
    assert done == sum(len(idx) for _, idx in jobs) and batches < done  # some batches held several texts
    key = 'seqtrain_serve_requests_total{route="/v1/summarize",code="200"}'
    assert after[key] - before.get(key, 0) == len(jobs)
    assert after["seqtrain_serve_request_duration_seconds_count"] >= len(jobs)


def test_each_limit_and_bad_body_is_one_json_error(server):
    from seqtrain.errors import SeqtrainError
    from seqtrain.generation.search import GenerationConfig, check_generation_args

    def flag_message(**settings) -> str:  # what seqtrain-generate says for the same values, by flag
        with pytest.raises(SeqtrainError) as e:
            check_generation_args(GenerationConfig(**settings))
        return str(e.value)

    cases = [
        (b"x" * 2001, 413, "body_too_large", "2000 bytes (--max-request-bytes)"),
        ({"texts": ["w1"] * 7}, 413, "too_many_texts", "7 texts; this server takes at most 6"),
        ({"texts": ["w1 " * 101]}, 413, "text_too_long", "texts[0]: 303 characters"),
        (b'{"texts": ["w1"', 400, "invalid_json", "not valid JSON"),
        (b'{"texts": ["w1 \xff"]}', 400, "invalid_utf8", "byte 0xff at offset 15"),
        (b'{"texts": ["w1 \\ud800"]}', 400, "invalid_utf8", "texts[0]: a lone surrogate U+D800"),
        (b"[1, 2]", 422, "invalid_request", "must be a JSON object"),
        ({"texts": ["w1"], "path": "/etc/passwd"}, 422, "unknown_field", "unknown field(s) path"),
        ({"texts": ["w1"], "model": "x"}, 422, "unknown_field", "unknown field(s) model"),
        ({"beam": 2}, 422, "invalid_request", "texts: missing"),
        ({"texts": []}, 422, "invalid_request", "at least one text"),
        ({"texts": ["w1", 3]}, 422, "invalid_request", "texts[1] must be a string"),
        (
            {"texts": ["w1"], "beam": 0},
            422,
            "invalid_setting",
            flag_message(beam=0).replace("--beam", "beam"),
        ),
        (
            {"texts": ["w1"], "beam": "4"},
            422,
            "invalid_setting",
            flag_message(beam="4").replace("--beam", "beam"),
        ),
        (
            {"texts": ["w1"], "nbest": 4},
            422,
            "invalid_setting",
            "nbest must be between 1 and beam (3), got 4",
        ),
        ({"texts": ["w1"], "lenpen": float("nan")}, 422, "invalid_setting", "lenpen must be a finite number"),
        (
            {"texts": ["w1"], "min_len": 9},
            422,
            "invalid_setting",
            "min_len 9 is above the maximum length max_len_b 8",
        ),
        (
            {"texts": ["w1"], "beam": 5},
            422,
            "invalid_setting",
            "beam 5 is above this server's limit (--max-beam 4)",
        ),
    ]
    for payload, status, kind, message in cases:
        if isinstance(payload, dict):
            payload = json.dumps(payload).encode()  # NaN as JSON's NaN, which Python reads back
        code, headers, data = server.request("POST", "/v1/summarize", payload)
        body = json.loads(data)
        assert (code, body["error"]["type"]) == (status, kind), (payload[:80], body)
        assert message in body["error"]["message"] and body["error"]["status"] == status, body
        assert headers["content-type"] == "application/json"
    status, body = server.summarize({"texts": ["w1 w2 w3"]})  # and nothing else was disturbed
    assert status == 200 and len(body["summaries"]) == 1
    m = server.metrics()
    assert m['seqtrain_serve_requests_total{route="/v1/summarize",code="413"}'] >= 3
    assert m['seqtrain_serve_requests_total{route="/v1/summarize",code="422"}'] >= 12


def test_full_queue_is_503_with_retry_after_and_slow_requests_time_out(server):
    before = server.metrics()
    results = {}
    slow = threading.Thread(
        target=lambda: results.setdefault("slow", server.summarize({"texts": [slow_text(8)]}))
    )
    slow.start()
    server.wait_for(
        "seqtrain_serve_batch_running", 1
    )  # the worker is busy for 8 s (the 4 s timeouts below fall inside)
    fours = [  # 4 requests of 6 texts fill the queue (--max-queue 24)
        threading.Thread(target=lambda i=i: results.setdefault(i, server.summarize({"texts": ["w1 w2"] * 6})))
        for i in range(4)
    ]
    for t in fours:
        t.start()
    server.wait_for("seqtrain_serve_queue_depth", 24)
    code, headers, data = server.request("POST", "/v1/summarize", {"texts": ["w1"]})
    assert code == 503 and json.loads(data)["error"]["type"] == "queue_full"
    assert int(headers["retry-after"]) >= 1
    # --request-timeout 4: all time out with 504, and the queued texts leave the queue while the batch still runs
    for i, t in enumerate(fours):
        t.join(30)
        assert results[i][0] == 504 and "--request-timeout" in results[i][1]["error"]["message"]
    m = server.metrics()
    assert m["seqtrain_serve_queue_depth"] == 0 and m["seqtrain_serve_batch_running"] == 1
    slow.join(30)
    assert results["slow"][0] == 504
    status, body = server.summarize({"texts": ["w1 w2 w3"]})
    assert status == 200
    after = server.metrics()
    for code, n in (("503", 1), ("504", 5)):
        key = f'seqtrain_serve_requests_total{{route="/v1/summarize",code="{code}"}}'
        assert after[key] - before.get(key, 0) == n


def test_a_client_that_disconnects_costs_the_others_nothing(server, checkpoint, texts, tmp_path):
    want = generated(checkpoint, texts[:2], tmp_path, {})
    results = {}
    slow = threading.Thread(
        target=lambda: results.setdefault("slow", server.summarize({"texts": [slow_text(2)]}))
    )
    slow.start()
    server.wait_for("seqtrain_serve_batch_running", 1)
    gone = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"texts": ["w1 w2 w3 w4", "w5 w6"]}).encode()
    gone.sendall(
        b"POST /v1/summarize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    server.wait_for("seqtrain_serve_queue_depth", 2)
    stays = threading.Thread(
        target=lambda: results.setdefault("stays", server.summarize({"texts": texts[:2]}))
    )
    stays.start()
    server.wait_for("seqtrain_serve_queue_depth", 4)
    gone.close()
    server.wait_for("seqtrain_serve_queue_depth", 2)  # the closed request's texts left the queue
    stays.join(30)
    slow.join(30)
    assert results["stays"][0] == 200 and results["stays"][1]["summaries"] == [w[0][1] for w in want]
    assert server.metrics()['seqtrain_serve_requests_total{route="/v1/summarize",code="499"}'] == 1


def test_a_body_that_never_arrives_is_408_and_holds_no_one_up(server):
    stalled = socket.create_connection(("127.0.0.1", server.port))
    stalled.sendall(
        b"POST /v1/summarize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
        + b"\r\nContent-Length: 100\r\n\r\n{\"texts\": "
    )  # fmt: skip
    # meanwhile others are answered (held up until the stalled body's 408, it would be a 504: the same 4 s)
    status, body = server.summarize({"texts": ["w1 w2 w3"]})
    assert status == 200
    stalled.settimeout(30)
    answer = http.client.HTTPResponse(stalled)
    answer.begin()
    error = json.loads(answer.read())["error"]
    stalled.close()
    assert answer.status == 408 and error["type"] == "body_timeout" and "within 4 s" in error["message"]


def test_a_failing_batch_fails_its_requests_with_500_and_the_server_goes_on(server):
    before = server.metrics()
    status, body = server.summarize({"texts": [FAIL]})
    assert status == 500 and body["error"] == {
        "status": 500,
        "type": "generation_failed",
        "message": "generation failed: RuntimeError: injected fault",
    }
    status, body = server.summarize({"texts": ["w1 w2 w3", "w4"]})
    assert status == 200 and len(body["summaries"]) == 2
    after = server.metrics()
    assert (
        after['seqtrain_serve_batches_total{outcome="error"}']
        == before['seqtrain_serve_batches_total{outcome="error"}'] + 1
    )
    assert "RuntimeError: injected fault" in server.log.read_text()  # the traceback is logged


def test_bearer_token_health_readiness_and_docs(server):
    for token in (None, "wrong", TOKEN[:-1]):
        code, headers, data = server.request("POST", "/v1/summarize", {"texts": ["w1"]}, token=token)
        assert code == 401 and headers["www-authenticate"] == "Bearer"
        assert json.loads(data)["error"]["type"] == "unauthorized"
        assert server.request("GET", "/metrics", token=token)[0] == 401
    assert server.request("GET", "/healthz", token=None)[::2] == (200, b'{"status":"alive"}')
    assert server.request("GET", "/readyz", token=None)[::2] == (200, b'{"status":"ready"}')
    code, _, data = server.request("GET", "/docs", token=None)
    assert code == 200 and b"swagger-ui" in data
    code, _, data = server.request("GET", "/openapi.json", token=None)
    spec = json.loads(data)["paths"]["/v1/summarize"]["post"]
    fields = spec["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert sorted(fields) == sorted(
        ["texts", "beam", "lenpen", "min_len", "max_len_b", "no_repeat_ngram_size", "nbest"]
    )
    code, _, data = server.request("GET", "/v1/info")
    info = json.loads(data)
    assert code == 200 and info["defaults"]["beam"] == 3 and info["max_source_tokens"] == 12
    code, _, data = server.request("GET", "/nowhere", token=None)
    assert code == 404 and json.loads(data)["error"]["status"] == 404


def test_a_lone_client_is_not_kept_waiting_for_company(checkpoint, texts, tmp_path):
    """One client at a time: no request ever came alongside another, so the worker has no company to wait for
    and runs each text at once, whatever --max-wait-ms says (here 10 s: waiting would take that long, up to
    100 s for a request). Batching under concurrency: test_answers_are_seqtrain_generates_whatever_..."""
    server = start(checkpoint, tmp_path, "--max-wait-ms", "10000")
    try:
        before = server.metrics()
        for text in texts[:4]:
            began = time.monotonic()
            status, body = server.summarize({"texts": [text]})
            assert status == 200, body
            assert time.monotonic() - began < 8  # less than one --max-wait-ms: it did not wait
        after = server.metrics()
        assert after["seqtrain_serve_batch_size_count"] - before["seqtrain_serve_batch_size_count"] == 4
    finally:
        assert stop(server) == 0, server.log.read_text()[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_answers_what_is_in_flight_then_exits_0(checkpoint, texts, tmp_path, sig):
    want = generated(checkpoint, texts[:3], tmp_path, {})
    server = start(checkpoint, tmp_path)
    try:
        results = {}
        slow = threading.Thread(
            target=lambda: results.setdefault("slow", server.summarize({"texts": [slow_text(1.5)]}))
        )
        slow.start()
        server.wait_for("seqtrain_serve_batch_running", 1)
        queued = threading.Thread(
            target=lambda: results.setdefault("queued", server.summarize({"texts": texts[:3]}))
        )
        queued.start()
        server.wait_for("seqtrain_serve_queue_depth", 3)
        server.proc.send_signal(sig)
        slow.join(30)
        queued.join(30)
        assert server.proc.wait(timeout=60) == 0, server.log.read_text()[-3000:]
        assert results["slow"][0] == 200
        assert results["queued"] == (200, results["queued"][1]) and results["queued"][1]["summaries"] == [
            w[0][1] for w in want
        ]
    finally:
        if server.proc.poll() is None:  # failed early: no server outlives its test
            server.proc.kill()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    log = server.log.read_text()
    assert f"{sig.name}: no new connections; answering what is in flight (4 texts" in log
    assert "stopped: every request in flight was answered" in log


def test_startup_errors_are_one_line(checkpoint, tmp_path, capsys):
    from seqtrain_cli.serve import cli_main

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    cases = [
        (["--path", str(tmp_path / "none.pt")], "--path", "no such file or folder"),
        (["--path", checkpoint, "--port", str(port)], f"--port {port}", "cannot listen there"),
        (["--path", checkpoint, "--port", "0", "--beam", "20"], "--beam 20", "above --max-beam 16"),
        (["--path", checkpoint, "--api-key-file", str(tmp_path / "nokey")], "--api-key-file", "cannot read"),
    ]
    try:
        for argv, *parts in cases:
            with pytest.raises(SystemExit) as e:
                cli_main(argv + ["--cpu"])
            err = capsys.readouterr().err
            line = [x for x in err.splitlines() if x.startswith("seqtrain-serve: error: ")]
            assert e.value.code == 1 and len(line) == 1 and all(p in line[0] for p in parts), err
        with pytest.raises(SystemExit) as e:
            cli_main(["--path", checkpoint, "--input", "x"])
        assert e.value.code == 2 and "--input: does nothing in seqtrain-serve" in capsys.readouterr().err
    finally:
        taken.close()
