"""seqtrain-score: parse the flags, then seqtrain.scoring.rouge.score."""

from __future__ import annotations

from seqtrain.config import from_args
from seqtrain.flags.tools import get_score_parser
from seqtrain.scoring.settings import ScoreConfig
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    args = get_score_parser().parse_args(argv)
    from seqtrain.scoring.rouge import score  # after parsing: --help and flag errors answer first

    score(from_args(ScoreConfig, args))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-score", main, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
