"""seqtrain-serve's flags: seqtrain-interactive's (the checkpoint, the device, the generation flags as every
request's defaults, --config presets) less those about reading and writing lines, plus the server's own group
(ServeConfig: where it listens, how it batches, the limits a request meets)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from seqtrain.config import add_settings, leave_out, setting, settings
from seqtrain.flag_bounds import POSITIVE_INT, Bounds
from seqtrain.generation.options import get_generation_parser, parse_generation_args


@settings
class ServeConfig:
    """Server"""

    host: str = setting(
        "127.0.0.1", "address to listen on (0.0.0.0: every interface; only when asked)", metavar="HOST"
    )
    port: int = setting(8000, "port to listen on (0: a free one, logged)", type=int, bounds=Bounds(0, 65535))
    max_batch_tokens: int = setting(
        4096,
        "a batch holds at most N padded source tokens (a longer text runs alone)",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    max_batch_size: int = setting(
        64, "a batch holds at most N texts", type=int, metavar="N", bounds=Bounds(1, 100_000)
    )
    max_wait_ms: float = setting(
        5.0,
        "an idle worker waits for more texts to batch with while they arrive less than this apart (10 times "
        "this at most)",
        type=float,
        metavar="MS",
        bounds=Bounds(0, 60_000),
    )
    max_queue: int = setting(
        256,
        "texts waiting for a batch at most; a request that does not fit gets 503 with Retry-After",
        type=int,
        metavar="N",
        bounds=Bounds(1, 1_000_000),
    )
    request_timeout: float = setting(
        60.0,
        "a request not answered within this many seconds gets 504 (its texts leave the queue)",
        type=float,
        metavar="S",
        bounds=Bounds(0, 86_400, lo_open=True),
    )
    max_request_bytes: int = setting(
        1 << 20, "largest request body, in bytes (413 above)", type=int, metavar="N", bounds=POSITIVE_INT
    )
    max_texts: int = setting(
        64, "most texts in one request (413 above)", type=int, metavar="N", bounds=Bounds(1, 1_000_000)
    )
    max_text_chars: int = setting(
        100_000,
        "most characters in one text (413 above); a text longer than the model's source positions in tokens "
        "is truncated as seqtrain-generate truncates it, and the response says so",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    max_beam: int = setting(
        16, "the largest beam a request may ask for", type=int, metavar="N", bounds=Bounds(1, 10000)
    )
    max_len_b_limit: int = setting(
        1024,
        "the largest max_len_b a request may ask for",
        type=int,
        metavar="N",
        bounds=Bounds(0, 1 << 20),
    )
    api_key_file: str | None = setting(
        None,
        "require 'Authorization: Bearer TOKEN' on /v1/ and /metrics, TOKEN the file's first line",
        metavar="FILE",
    )
    max_connections: int = setting(
        1024,
        "open connections at most; more are answered 503 at once",
        type=int,
        metavar="N",
        bounds=POSITIVE_INT,
    )
    access_log: bool = setting(True, "log a line per request", action=argparse.BooleanOptionalAction)


# seqtrain-interactive's flags that do nothing in a server: where its text comes from and how it is printed,
# and its file batching (a server batches by --max-batch-tokens / --max-batch-size)
NOT_IN_SERVE = ("input", "quiet", "post_process", "output_format", "max_tokens", "batch_size")


def _leave_out(parser: argparse.ArgumentParser, dests: Sequence[str]) -> None:
    """Take the flags of `dests` out of `parser` (their defaults kept); given, each is refused with one line."""
    for action in [a for a in parser._actions if a.dest in dests]:
        parser._remove_action(action)
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        for name in action.option_strings:
            parser._option_string_actions.pop(name, None)
        leave_out(parser, action.option_strings, action.dest)
        parser.set_defaults(**{action.dest: action.default})


def get_serve_parser() -> argparse.ArgumentParser:
    parser = get_generation_parser(program="interactive")
    parser.prog = "seqtrain-serve"
    parser.description = (
        "Serve summaries over HTTP (POST /v1/summarize), batching the texts of concurrent requests through "
        "seqtrain-generate's beam search; the generation flags are every request's defaults."
    )
    _leave_out(parser, NOT_IN_SERVE)
    add_settings(parser, ServeConfig, "Server")
    return parser


def parse_serve_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """seqtrain-serve's flags, parsed as seqtrain-generate's are (--config FILE supplies defaults)."""
    return parse_generation_args(argv, interactive=True, parser=get_serve_parser())
