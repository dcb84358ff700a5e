"""seqtrain.generation.generate's checks that need no model: what ranks under torchrun must share (same_run) and
the settings compared (run_settings)."""

from __future__ import annotations

import pytest

from seqtrain.config import from_args
from seqtrain.errors import SeqtrainError
from seqtrain.generation.generate import run_settings, same_run
from seqtrain.generation.options import parse_generation_args
from seqtrain.generation.program import GenerateConfig


def _settings(*flags: str) -> dict:
    return run_settings(from_args(GenerateConfig, parse_generation_args(["--path", "ck.pt", *flags])))


def test_ranks_must_share_settings_and_input():
    base = _settings("--beam", "5")
    assert base["--beam"] == 5 and base["--lenpen"] == 1.0 and base["--rerank"] is None
    same_run([("in.txt", 9, "d", base), ("in.txt", 9, "d", _settings("--beam", "5", "--batch-size", "3"))])
    with pytest.raises(SeqtrainError) as e:
        same_run([("in.txt", 9, "d", base), ("in.txt", 9, "d", _settings("--beam", "1", "--lenpen", "2"))])
    assert str(e.value) == (
        "the ranks have different generation settings: rank 0 --beam 5, --lenpen 1.0, rank 1 --beam 1, --lenpen "
        "2.0; every rank must generate with the same settings (the ranks split one run)"
    )
    for flags in (["--rerank", "length"], ["--compute-type", "int8"], ["--post-process", "sentencepiece"]):
        with pytest.raises(SeqtrainError, match=f"rank 0 {flags[0]} .*, rank 2 {flags[0]} {flags[1]};"):
            same_run([("in.txt", 9, "d", base)] * 2 + [("in.txt", 9, "d", _settings("--beam", "5", *flags))])
    with pytest.raises(
        SeqtrainError, match="different inputs: rank 0 has 9 examples from in.txt, rank 1 7 from"
    ):
        same_run([("in.txt", 9, "d", base), ("in.txt", 7, "e", dict(base))])
