"""The parsers of the checkpoint tools and seqtrain-score, composed from the settings beside their code
(seqtrain.checkpoint.convert, seqtrain.checkpoint.average, seqtrain.scoring.settings): those sit below the flag
layer, so their parsers are made here."""

from __future__ import annotations

import argparse

from seqtrain.config import add_settings
from seqtrain.flags.parsers import ArgumentParser, add_negations
from seqtrain.scoring.settings import ScoreConfig


def get_convert_parser() -> argparse.ArgumentParser:
    """seqtrain-convert's parser, composed from its settings (seqtrain.checkpoint.convert)."""
    from seqtrain.checkpoint import convert  # imports torch: only seqtrain-convert's parser needs it

    p = ArgumentParser(
        prog="seqtrain-convert",
        description="Convert a BART checkpoint between seqtrain, fairseq and Hugging Face formats.",
    )
    add_settings(p, convert.ConvertConfig, group=p)
    g = p.add_argument_group("generation settings", convert.HF_GENERATION_HELP)
    add_settings(p, convert.HfGenerationConfig, group=g)
    return add_negations(p)


def get_average_parser() -> argparse.ArgumentParser:
    """seqtrain-average-checkpoints' parser, composed from its settings (seqtrain.checkpoint.average)."""
    from seqtrain.checkpoint import average  # imports torch: only this program's parser needs it

    p = ArgumentParser(
        prog="seqtrain-average-checkpoints",
        description="Average the parameters of checkpoints (seqtrain or fairseq) into a new checkpoint.",
    )
    add_settings(p, average.AverageConfig, group=p)
    exclusive = p.add_mutually_exclusive_group()
    exclusive._group_actions += [p._option_string_actions[f] for f in average.EXCLUSIVE]
    return add_negations(p)


def get_score_parser() -> argparse.ArgumentParser:
    """seqtrain-score's parser, composed from its settings (seqtrain.scoring.settings)."""
    p = ArgumentParser(
        prog="seqtrain-score",
        description="ROUGE F1 x 100 (rouge-score, Porter stemming) averaged over lines; ROUGE-Lsum splits "
        "sentences at '.', '!', '?' followed by whitespace.",
    )
    add_settings(p, ScoreConfig, group=p)
    return add_negations(p)
