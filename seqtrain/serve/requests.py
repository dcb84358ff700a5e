"""A POST /v1/summarize body to its texts and search settings, or an ApiError naming what is wrong.

The body is `{"texts": [...], "beam": 4, "lenpen": 2.0, "min_len": 10, "max_len_b": 60,
"no_repeat_ngram_size": 3, "nbest": 1}`, every setting optional (the server's flags are the defaults). Each
setting is checked with the rules and messages of its flag (seqtrain.generation.search.check_generation_args,
naming it by its JSON key), then against the server's caps (--max-beam, --max-len-b-limit). Statuses: 400 for a
body that is not UTF-8 JSON, 413 for one over a size limit, 422 for a well-formed body whose content is wrong.
Nothing in a request names a file or a model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import loads_bounded
from seqtrain.generation.search import KINDS, GenerationConfig, check_generation_args

# the search settings a request may choose (seqtrain-generate's flags of these names)
REQUEST_SETTINGS = ("beam", "lenpen", "min_len", "max_len_b", "no_repeat_ngram_size", "nbest")
FIELDS = ("texts", *REQUEST_SETTINGS)


class ApiError(Exception):
    """An HTTP error answered as {"error": {"status", "type", "message"}}; `headers` go with it."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"status": self.status, "type": self.kind, "message": self.message}}


@dataclass(frozen=True)
class Limits:
    """What one request may hold and ask for (ServeConfig's --max-texts, --max-text-chars, --max-beam, ...)."""

    max_texts: int = 64
    max_text_chars: int = 100_000
    max_beam: int = 16
    max_len_b_limit: int = 1024


def decode_json(body: bytes) -> Any:
    """The JSON value of a body: 400 for bytes that are not UTF-8 or text that is not JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(
            400,
            "invalid_utf8",
            f"the body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start})",
        ) from None
    try:
        return loads_bounded(text)
    except ValueError as e:  # json.JSONDecodeError, or nesting / integer size past the bounds
        raise ApiError(400, "invalid_json", f"the body is not valid JSON ({e})") from None


def parse_request(
    body: bytes, defaults: GenerationConfig, limits: Limits
) -> tuple[list[str], GenerationConfig]:
    """A request body's texts and search settings (the server's `defaults` with the request's choices)."""
    obj = decode_json(body)
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_request", 'the body must be a JSON object: {"texts": ["..."], ...}')
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise ApiError(
            422, "unknown_field", f"unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}"
        )
    texts = check_texts(obj.get("texts"), limits)
    values = {k: obj[k] for k in REQUEST_SETTINGS if k in obj}
    for (
        k,
        v,
    ) in values.items():  # a float setting given as an integer (lenpen 2) is that float, as on the flag
        if KINDS[k] is float and isinstance(v, int) and not isinstance(v, bool):
            values[k] = float(v)
    config = dataclasses.replace(defaults, **values)
    try:
        check_generation_args(config, lambda dest: dest)
    except SeqtrainError as e:
        raise ApiError(422, "invalid_setting", str(e)) from None
    if config.beam > limits.max_beam:
        raise ApiError(
            422,
            "invalid_setting",
            f"beam {config.beam} is above this server's limit (--max-beam {limits.max_beam})",
        )
    if "max_len_b" in values and config.max_len_b > limits.max_len_b_limit:
        raise ApiError(
            422,
            "invalid_setting",
            f"max_len_b {config.max_len_b} is above this server's limit (--max-len-b-limit "
            f"{limits.max_len_b_limit})",
        )
    return texts, config


def check_texts(texts: Any, limits: Limits) -> list[str]:
    if texts is None:
        raise ApiError(422, "invalid_request", 'texts: missing; give {"texts": ["a document", ...]}')
    if not isinstance(texts, list):
        raise ApiError(422, "invalid_request", f"texts must be a list of strings, got {type(texts).__name__}")
    if not texts:
        raise ApiError(422, "invalid_request", "texts: give at least one text")
    if len(texts) > limits.max_texts:
        raise ApiError(
            413,
            "too_many_texts",
            f"texts: {len(texts)} texts; this server takes at most {limits.max_texts} per request (--max-texts)",
        )
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ApiError(422, "invalid_request", f"texts[{i}] must be a string, got {type(t).__name__}")
        if len(t) > limits.max_text_chars:
            raise ApiError(
                413,
                "text_too_long",
                f"texts[{i}]: {len(t)} characters; this server takes at most {limits.max_text_chars} "
                "(--max-text-chars)",
            )
        try:  # a JSON escape of a lone surrogate ("\ud800") decodes to a str that is no UTF-8 text
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(
                400,
                "invalid_utf8",
                f"texts[{i}]: a lone surrogate U+{ord(t[e.start]):04X} at character {e.start}",
            ) from None
    return texts
