"""seqtrain-generate: parse the flags, then seqtrain.generation.generate.generate."""

from __future__ import annotations

from typing import Any, TextIO

from seqtrain.generation.options import parse_generation_args
from seqtrain_cli._main import run_cli


def generate_main(argv: list[str] | None = None, out: TextIO | None = None) -> dict[str, Any]:
    """Parse `argv` and generate, printing to `out` (stdout); returns seqtrain.generation.generate.generate's result."""
    from seqtrain.generation.generate import generate  # after parsing: --help and flag errors answer first

    return generate(parse_generation_args(argv), out)


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-generate", lambda a: generate_main(a) and 0, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
