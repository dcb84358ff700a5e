"""seqtrain-preprocess: parse the flags, then seqtrain.preprocess.databin.preprocess (raw text -> data-bin)."""

from __future__ import annotations

from typing import Any

from seqtrain.preprocess.options import get_preprocessing_parser
from seqtrain_cli._main import run_cli


def preprocess_main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse `argv` and preprocess; returns seqtrain.preprocess.databin.preprocess's summary."""
    from seqtrain.preprocess.databin import preprocess  # after parsing: --help and flag errors answer first

    return preprocess(get_preprocessing_parser().parse_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-preprocess", lambda a: preprocess_main(a) and 0, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
