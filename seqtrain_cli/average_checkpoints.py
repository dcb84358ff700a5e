"""seqtrain-average-checkpoints: parse the flags, then seqtrain.checkpoint.average.main (examples there)."""

from __future__ import annotations

from seqtrain.config import from_args
from seqtrain.flags.tools import get_average_parser
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    args = get_average_parser().parse_args(argv)
    # after parsing: --help and flag errors answer first
    from seqtrain.checkpoint.average import AverageConfig
    from seqtrain.checkpoint.average import main as average

    average(from_args(AverageConfig, args))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-average-checkpoints", main, argv)


if __name__ == "__main__":
    cli_main()
