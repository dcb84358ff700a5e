"""seqtrain-preprocess: parse the flags, then seqtrain.preprocess.preprocess (raw text -> data-bin)."""

from __future__ import annotations

from typing import Any

from seqtrain.options import get_preprocessing_parser
from seqtrain_cli._main import run_cli


def preprocess_main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse `argv` and preprocess; returns seqtrain.preprocess.preprocess's summary."""
    from seqtrain.preprocess import preprocess

    return preprocess(get_preprocessing_parser().parse_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-preprocess", lambda a: preprocess_main(a) and 0, argv)


if __name__ == "__main__":
    cli_main()
