"""seqtrain-generate: thin entry point; the work is in seqtrain.generate."""
from __future__ import annotations

from typing import List, Optional

from seqtrain_cli._main import run_cli


def main(argv: List[str]) -> int:
    from seqtrain.generate import main as generate_main

    generate_main(argv)
    return 0


def cli_main(argv: Optional[List[str]] = None) -> None:
    run_cli("seqtrain-generate", main, argv)


if __name__ == "__main__":
    cli_main()
