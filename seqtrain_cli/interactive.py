"""seqtrain-interactive: parse the flags, then seqtrain.generation.interactive.interactive."""

from __future__ import annotations

from typing import TextIO

from seqtrain.generation.options import parse_generation_args
from seqtrain_cli._main import run_cli


def interactive_main(
    argv: list[str] | None = None, inp: TextIO | None = None, out: TextIO | None = None
) -> int:
    """Parse `argv` and answer the lines of `inp` (stdin) on `out` (stdout); returns the number of lines."""
    from seqtrain.generation.interactive import (
        interactive,  # after parsing: --help and flag errors answer first
    )

    return interactive(parse_generation_args(argv, interactive=True), inp, out)


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-interactive", lambda a: interactive_main(a) and 0, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
