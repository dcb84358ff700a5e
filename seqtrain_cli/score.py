"""seqtrain-score: ROUGE-1/2/L/Lsum of a hypothesis file against a reference file (one example per line)."""
from __future__ import annotations

import argparse
from typing import List, Optional

from seqtrain.scoring.rouge import format_summary, score_files, write_json
from seqtrain_cli._main import run_cli


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqtrain-score",
        description="ROUGE F1 x 100 (rouge-score, Porter stemming) averaged over lines; ROUGE-Lsum splits "
                    "sentences at '.', '!', '?' followed by whitespace.",
    )
    p.add_argument("--sys", required=True, metavar="HYP", help="hypotheses, one per line")
    p.add_argument("--ref", required=True, metavar="REF", help="references, one per line, aligned with --sys")
    p.add_argument("--json", metavar="OUT", help="also write the scores as JSON to OUT")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def main(argv: List[str]) -> Optional[int]:
    args = get_parser().parse_args(argv)
    scores = score_files(args.sys, args.ref)
    print(format_summary(scores))
    if args.json:
        write_json(scores, args.json, sys=args.sys, ref=args.ref)
    return 0


def cli_main(argv: Optional[List[str]] = None) -> None:
    run_cli("seqtrain-score", main, argv)


if __name__ == "__main__":
    cli_main()
