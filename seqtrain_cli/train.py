"""seqtrain-train: parse the flags, read them once into a TrainConfig (seqtrain.train.program), then
seqtrain.train.loop.train."""

from __future__ import annotations

from seqtrain.flags.training import parse_train_args
from seqtrain.generation.options import generation_flags
from seqtrain_cli._main import run_cli


def train_main(argv: list[str] | None = None) -> int:
    """Parse `argv` and train (raises SeqtrainError on user errors); returns the exit code."""
    # after parsing: --help and flag errors answer first
    from seqtrain.train.loop import train
    from seqtrain.train.program import train_config

    return train(
        train_config(parse_train_args(argv, generation_flags))
    )  # a preset's generation keys are skipped


def cli_main(argv: list[str] | None = None) -> None:
    run_cli("seqtrain-train", train_main, argv)


if __name__ == "__main__":
    cli_main()
