"""`seqtrain-serve`: the program's front end. Reads its flags once (GenerateConfig, as seqtrain-generate does, and
ServeConfig), loads the model with seqtrain-generate's loader (any checkpoint or export it reads; the device,
--fp16/--bf16, --compute-type int8, a Hugging Face folder's generation defaults), checks the generation flags
as seqtrain-generate checks them, warms the model with one batch, binds the address, and runs uvicorn until
SIGTERM or SIGINT: then it stops accepting connections, answers every request it holds, and exits 0 (a second
signal stops it at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from seqtrain.checkpoint.fairseq import stored_model_fields
from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.generation.program import GenerateConfig, load_generation_model
from seqtrain.generation.search import check_generation_args
from seqtrain.logging import setup_logging
from seqtrain.serve.batcher import Batcher
from seqtrain.serve.metrics import Metrics
from seqtrain.serve.options import ServeConfig
from seqtrain.serve.requests import REQUEST_SETTINGS, Limits

logger = logging.getLogger("seqtrain.serve")

try:  # the serve extra: pip install 'seqtrain[serve]'
    import uvicorn

    from seqtrain.serve.app import ServerState, build_app
except ImportError as e:  # named when the program starts (seqtrain-serve --help works without it)
    uvicorn, MISSING = None, e
else:
    MISSING = None


def check_serve_settings(cfg: GenerateConfig, serve: ServeConfig) -> None:
    """seqtrain-serve's checks across its settings (the generation flags with the model's defaults taken)."""
    if cfg.search.beam > serve.max_beam:
        raise SeqtrainError(f"--beam {cfg.search.beam} is above --max-beam {serve.max_beam}")
    if cfg.search.max_len_b > serve.max_len_b_limit:
        raise SeqtrainError(
            f"--max-len-b {cfg.search.max_len_b} is above --max-len-b-limit {serve.max_len_b_limit}"
        )
    if serve.max_texts > serve.max_queue:
        raise SeqtrainError(
            f"--max-texts {serve.max_texts} is above --max-queue {serve.max_queue}: such a request could never be "
            "queued"
        )
    if serve.max_request_bytes < 16:
        raise SeqtrainError(f"--max-request-bytes {serve.max_request_bytes} cannot hold a request")


def read_api_key(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except OSError as e:
        raise SeqtrainError(f"--api-key-file {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise SeqtrainError(f"--api-key-file {path}: not UTF-8 text") from None
    if not key:
        raise SeqtrainError(f"--api-key-file {path}: its first line is empty; put the token there")
    return key


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (not yet listening), or one line naming --host/--port and why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SeqtrainError(f"--host {host}: cannot resolve ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise SeqtrainError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    sock.set_inheritable(True)
    return sock


def serve(args: argparse.Namespace) -> int:
    """Serve with the parsed flags (seqtrain.serve.options.parse_serve_args) until SIGTERM/SIGINT; returns 0 after
    answering every request it held."""
    if uvicorn is None:
        raise SeqtrainError(
            f"seqtrain-serve needs FastAPI and uvicorn ({MISSING}): pip install 'seqtrain[serve]'"
        )
    cfg = from_args(GenerateConfig, args)  # the program's one read of its flags
    opts = from_args(ServeConfig, args)
    if not cfg.load.path:
        raise SeqtrainError("--path: give the checkpoint to serve")
    api_key = read_api_key(opts.api_key_file)
    try:
        handler = setup_logging(sys.stderr, log_file=cfg.log.log_file)
    except OSError as e:
        raise SeqtrainError(f"--log-file {cfg.log.log_file}: cannot write ({e.strerror})") from None
    try:
        return _serve(cfg, opts, api_key)
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def _serve(cfg: GenerateConfig, opts: ServeConfig, api_key: str | None) -> int:
    sock = bind(opts.host, opts.port)
    try:
        loaded = load_generation_model(cfg)
        check_generation_args(cfg.search)
        check_serve_settings(cfg, opts)
        metrics = Metrics()
        batcher = Batcher(
            loaded,
            metrics,
            opts.max_batch_tokens,
            opts.max_batch_size,
            opts.max_wait_ms / 1000,
            opts.max_queue,
        )
        batcher.start(cfg.search)
        limits = Limits(opts.max_texts, opts.max_text_chars, opts.max_beam, opts.max_len_b_limit)
        state = ServerState(
            batcher, metrics, cfg.search, limits, opts.max_request_bytes, opts.request_timeout, api_key
        )
        state.info = describe(cfg, opts, loaded)
        metrics.gauge("seqtrain_serve_queue_depth", "texts waiting for a batch", batcher.queued)
        metrics.gauge(
            "seqtrain_serve_batch_running", "texts in the batch being generated", lambda: batcher.running
        )
        metrics.gauge(
            "seqtrain_serve_ready", "1 when the server takes requests", lambda: int(not state.draining)
        )
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        listening = (
            f"listening on http://{shown}:{port} (POST /v1/summarize, docs at /docs; {state.info['model']}; "
            f"Ctrl-C or SIGTERM answers what is in flight, then stops)"
        )
        server = _Server(_uvicorn_config(build_app(state), opts), state, listening)
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
    batcher.stop()
    if server.force_exit:
        raise SeqtrainError("stopped by a second signal before every request in flight was answered")
    logger.info("stopped: every request in flight was answered")
    return 0


def _uvicorn_config(app: Any, opts: ServeConfig) -> Any:
    return uvicorn.Config(
        app,
        log_config=None,  # seqtrain's logging (stderr, --log-file) carries uvicorn's lines
        access_log=opts.access_log,
        limit_concurrency=opts.max_connections,
        timeout_graceful_shutdown=int(opts.request_timeout) + 5,
        lifespan="off",
        server_header=False,
    )


def describe(cfg: GenerateConfig, opts: ServeConfig, loaded: Any) -> dict[str, Any]:
    """GET /v1/info: the model, the settings a request gets by default and the limits."""
    arch = stored_model_fields(loaded.lm.args).get("arch")
    search = {k: getattr(cfg.search, k) for k in REQUEST_SETTINGS}
    limits = {
        k: getattr(opts, k)
        for k in (
            "max_texts",
            "max_text_chars",
            "max_request_bytes",
            "max_beam",
            "max_len_b_limit",
            "max_queue",
        )
    }
    model = f"{arch}, {loaded.lm.format}, {loaded.device}, {next(loaded.model.parameters()).dtype}".replace(
        "torch.", ""
    )
    return {
        "model": model,
        "path": cfg.load.path,
        "defaults": search,
        "search": {k: v for k, v in dataclasses.asdict(cfg.search).items() if v is not None},
        "limits": limits,
        "batching": {
            "max_batch_tokens": opts.max_batch_tokens,
            "max_batch_size": opts.max_batch_size,
            "max_wait_ms": opts.max_wait_ms,
        },
        "max_source_tokens": loaded.model.max_positions()[0],
    }


class _Server(uvicorn.Server if uvicorn is not None else object):  # type: ignore[misc]
    """uvicorn's server with seqtrain's signal handling: the first SIGTERM/SIGINT drains (no new connections,
    every request held answered, /readyz 503 meanwhile) and the program exits 0; a second one stops it at once.
    uvicorn's own handling raises the signal again after draining, which ends the process with 143 / 130."""

    def __init__(self, config: Any, state: Any, listening: str):
        super().__init__(config)
        self.state, self.listening = state, listening

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:  # the line a process manager or a test waits for: connections are accepted from now
            logger.info(self.listening)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.should_exit:
            self.force_exit = True
            return
        self.should_exit = True
        self.state.draining = True
        held = self.state.batcher.queued() + self.state.batcher.running
        logger.info(
            f"{signal.Signals(signum).name}: no new connections; answering what is in flight ({held} texts "
            "queued or generating), then stopping (a second signal stops at once)"
        )
