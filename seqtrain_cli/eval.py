"""seqtrain-eval: parse the flags, then seqtrain.evaluation.report.evaluate."""

from __future__ import annotations

from seqtrain.evaluation.report import evaluate, get_eval_parser
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    evaluate(get_eval_parser().parse_args(argv))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-eval", main, argv, stop_early=True)


if __name__ == "__main__":
    cli_main()
