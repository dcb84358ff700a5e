"""seqtrain-score: parse the flags, then seqtrain.scoring.rouge.score."""
from __future__ import annotations

from typing import List, Optional

from seqtrain.options import get_score_parser
from seqtrain_cli._main import run_cli


def main(argv: Optional[List[str]] = None) -> None:
    from seqtrain.scoring.rouge import score

    score(get_score_parser().parse_args(argv))


def cli_main(argv: Optional[List[str]] = None) -> None:
    run_cli("seqtrain-score", main, argv)


if __name__ == "__main__":
    cli_main()
