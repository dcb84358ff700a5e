"""seqtrain-score: parse the flags, then seqtrain.scoring.rouge.score."""

from __future__ import annotations

from seqtrain.flags.tools import get_score_parser
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    from seqtrain.scoring.rouge import score  # after parsing: --help and flag errors answer first

    score(get_score_parser().parse_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-score", main, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
