"""seqtrain-convert: parse the flags, then seqtrain.checkpoint.convert.convert (see there for examples)."""

from __future__ import annotations

from seqtrain.config import from_args
from seqtrain.flags.tools import get_convert_parser
from seqtrain_cli._main import run_cli


def main(argv: list[str] | None = None) -> None:
    args = get_convert_parser().parse_args(argv)
    # after parsing: --help and flag errors answer first
    from seqtrain.checkpoint.convert import ConvertConfig, HfGenerationConfig, convert

    convert(from_args(ConvertConfig, args), from_args(HfGenerationConfig, args))


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-convert", main, argv)


if __name__ == "__main__":
    cli_main()
