"""The HTTP face of seqtrain-serve (FastAPI): POST /v1/summarize, GET /v1/info, /healthz, /readyz, /metrics,
and the OpenAPI page at /docs.

Every error is one JSON object, {"error": {"status", "type", "message"}}, with the status that says whose fault
it is: 400 a body that is not UTF-8 JSON (whatever its Content-Type says), 401 a missing or wrong bearer token,
408 a body not received whole within --request-timeout, 413 a body, a text or a list of texts over its limit, 422
a wrong field or an out-of-range setting, 503 a full queue (with Retry-After), 504 a request not answered within
--request-timeout, 500 a failed batch. A client that closes its connection before the answer is counted as 499
(nginx's code) and its texts leave the queue.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from seqtrain.generation.search import GenerationConfig
from seqtrain.serve.batcher import Answer, Batcher
from seqtrain.serve.metrics import Metrics
from seqtrain.serve.requests import REQUEST_SETTINGS, ApiError, Limits, parse_request

logger = logging.getLogger("seqtrain.serve")

ROUTES = ("/v1/summarize", "/v1/info", "/healthz", "/readyz", "/metrics", "/docs", "/openapi.json")


@dataclass
class ServerState:
    """What the routes read: the server's settings and its moving parts."""

    batcher: Batcher
    metrics: Metrics
    defaults: GenerationConfig
    limits: Limits
    max_request_bytes: int
    request_timeout: float
    api_key: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    draining: bool = False


# ------------------------------------------------------------------------------ the documented shapes (/docs)
class SummarizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] = Field(description="the documents to summarize, one string each", min_length=1)
    beam: int | None = Field(None, description="beam size (default: the server's --beam)")
    lenpen: float | None = Field(None, description="length penalty (default: the server's --lenpen)")
    min_len: int | None = Field(None, description="minimum summary length in tokens (default: --min-len)")
    max_len_b: int | None = Field(None, description="maximum summary length in tokens (default: --max-len-b)")
    no_repeat_ngram_size: int | None = Field(
        None, description="block repeated n-grams (default: as the server)"
    )
    nbest: int | None = Field(None, description="hypotheses returned per text, best first (default: --nbest)")


class Hypothesis(BaseModel):
    summary: str
    score: float = Field(
        description="length-normalized log-probability, base 2 (seqtrain-generate's H-/D- lines)"
    )
    tokens: int = Field(description="generated tokens, the final </s> included")


class TextResult(BaseModel):
    hypotheses: list[Hypothesis]
    source_tokens: int = Field(description="the text's tokens with </s>, before any truncation")
    truncated: bool = Field(description="the text was longer than the model's source positions and was cut")


class SummarizeResponse(BaseModel):
    summaries: list[str] = Field(description="the best summary of each text, in order")
    results: list[TextResult]
    settings: dict[str, float]


class ErrorDetail(BaseModel):
    status: int
    type: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


# the bearer token, when given (module level: FastAPI reads the annotation by name)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 408, 413, 422, 500, 503, 504)}


# ------------------------------------------------------------------------------------------------ the app
class Observe:
    """ASGI middleware: every HTTP request counted by route and status, /v1/summarize's answers timed."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def observed(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            timed = route == "/v1/summarize" and status[0] == 200
            self.metrics.request(route, status[0], time.perf_counter() - start if timed else None)


class ClientGone(Exception):
    pass


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="seqtrain-serve",
        description="Summaries from a seqtrain, fairseq or Hugging Face BART checkpoint, batched across requests.",
        version="1",
    )
    app.add_middleware(Observe, metrics=state.metrics)

    def authorized(credentials: Credentials) -> None:
        if state.api_key is None:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        if not hmac.compare_digest(given, state.api_key.encode()):
            raise ApiError(
                401,
                "unauthorized",
                "give 'Authorization: Bearer TOKEN' (--api-key-file)",
                {"WWW-Authenticate": "Bearer"},
            )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = str(e.detail).lower().replace(" ", "_")
        return JSONResponse(
            ApiError(e.status_code, kind, str(e.detail)).body(), e.status_code, headers=e.headers
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception(f"{request.method} {request.url.path} failed")
        return JSONResponse(ApiError(500, "internal_error", f"{type(e).__name__}: {e}").body(), 500)

    schema = SummarizeRequest.model_json_schema()

    @app.post(
        "/v1/summarize",
        response_model=SummarizeResponse,
        responses=ERRORS,
        dependencies=[Depends(authorized)],
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}
        },
    )
    async def summarize(request: Request) -> JSONResponse:
        """Summarize `texts` (each setting optional: the server's flags are the defaults)."""
        start = time.monotonic()
        with state.batcher.receiving():
            try:
                body = await asyncio.wait_for(
                    read_body(request, state.max_request_bytes), state.request_timeout
                )
            except ClientDisconnect:  # gone before its body arrived whole
                return Response(status_code=499)
            except TimeoutError:  # a client that never finishes its body holds no worker, and not for long
                raise ApiError(
                    408, "body_timeout", f"the body did not arrive within {state.request_timeout:g} s"
                ) from None
            texts, config = parse_request(body, state.defaults, state.limits)
            sources = await run_in_threadpool(state.batcher.encode, texts)
            answer = Answer(len(texts), asyncio.get_running_loop())
            state.batcher.submit(answer, sources, config)
        try:
            results = await wait_for(
                request, answer, state, state.request_timeout - (time.monotonic() - start)
            )
        except ClientGone:
            return Response(status_code=499)
        settings = {k: getattr(config, k) for k in REQUEST_SETTINGS}
        summaries = [r["hypotheses"][0]["summary"] for r in results]
        return JSONResponse({"summaries": summaries, "results": results, "settings": settings})

    @app.get("/v1/info", dependencies=[Depends(authorized)])
    async def info() -> dict[str, Any]:
        """The model, the default settings and the limits of this server."""
        return state.info

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """200 while the process runs."""
        return {"status": "alive"}

    @app.get("/readyz", responses={503: {"model": ErrorBody}})
    async def readyz() -> JSONResponse:
        """200 when the model is loaded and warm and the server takes requests; 503 while it drains."""
        if state.draining:
            return JSONResponse(ApiError(503, "draining", "the server is shutting down").body(), 503)
        if not state.batcher.alive():
            return JSONResponse(ApiError(503, "not_ready", "the batching worker is not running").body(), 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(authorized)])
    async def metrics() -> PlainTextResponse:
        """Prometheus' text format: requests by route and status, latency, batch sizes, queue depth,
        summaries/s, resident memory."""
        return PlainTextResponse(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `limit` bytes (Content-Length, or counted)."""
    declared = request.headers.get("content-length")
    too_big = ApiError(
        413, "body_too_large", f"the body is over this server's {limit} bytes (--max-request-bytes)"
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    return bytes(body)


async def wait_for(
    request: Request, answer: Answer, state: ServerState, timeout: float
) -> list[dict[str, Any]]:
    """The request's results; ClientGone when its client closes the connection first, 504 when `timeout`
    passes (either way its texts leave the queue)."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {answer.future, gone}, timeout=max(timeout, 0), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if answer.future.done():
        return answer.future.result()  # an ApiError (500) raises here
    state.batcher.cancel(answer)
    answer.future.cancel()
    if gone in done:
        raise ClientGone
    raise ApiError(
        504, "timeout", f"not answered within this server's {state.request_timeout:g} s (--request-timeout)"
    )


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body is read: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
