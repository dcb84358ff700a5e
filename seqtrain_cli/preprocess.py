"""Console script `seqtrain-preprocess`: raw text -> data-bin (see seqtrain/preprocess.py)."""
from __future__ import annotations

from typing import List, Optional

from seqtrain.preprocess import main
from seqtrain_cli._main import run_cli


def cli_main(argv: Optional[List[str]] = None) -> None:
    run_cli("seqtrain-preprocess", main, argv)


if __name__ == "__main__":
    cli_main()
