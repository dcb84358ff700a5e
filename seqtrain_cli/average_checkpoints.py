"""seqtrain-average-checkpoints: parse the flags, then seqtrain.checkpoint.average.main (examples there)."""

from __future__ import annotations

from seqtrain.flags.tools import get_average_parser
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    from seqtrain.checkpoint.average import (
        main as average,  # after parsing: --help and flag errors answer first
    )

    average(get_average_parser().parse_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-average-checkpoints", main, argv)


if __name__ == "__main__":
    cli_main()
