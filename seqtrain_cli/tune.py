"""seqtrain-tune: parse the flags, then seqtrain.generation.tune.tune."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from seqtrain.generation.options import get_tune_parser, parse_generation_args
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None, out: TextIO | None = None) -> dict[str, Any]:
    """Parse `argv`, search, print the table to `out` (stdout); returns tune.json's content."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_generation_args(argv, parser=get_tune_parser())
    from seqtrain.generation.tune import tune  # after parsing: --help and flag errors answer first

    return tune(args, out)


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-tune", lambda a: main(a) and 0, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
