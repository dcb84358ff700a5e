"""seqtrain-serve: parse the flags, then seqtrain.serve.server.serve."""

from __future__ import annotations

from seqtrain.serve.options import parse_serve_args
from seqtrain_cli._main import run_cli


def serve_main(argv: list[str] | None = None) -> int:
    """Parse `argv` and serve until SIGTERM/SIGINT; returns 0 once every request in flight is answered."""
    from seqtrain.serve.server import serve  # after parsing: --help and flag errors answer first

    return serve(parse_serve_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-serve", serve_main, argv)


if __name__ == "__main__":
    cli_main()
