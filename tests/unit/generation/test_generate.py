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


def test_generation_fits_its_threads_to_a_busy_machine(fairseq_tiny, monkeypatch, caplog, tmp_path):
    """seqtrain-generate, -interactive, -tune and -serve load their model through load_generation_model, which
    picks the intra-op threads as training does (seqtrain.host_cpu: torch's one per core made the quickstart's
    300 test summaries 13x slower on a 2-core machine other work kept busy) and says so; OMP_NUM_THREADS wins."""
    import io
    import logging

    import torch

    from seqtrain import host_cpu
    from seqtrain_cli.generate import generate_main

    (tmp_path / "in.txt").write_text("w1 w2 w3\n", encoding="utf-8")
    argv = ["--path", str(fairseq_tiny / "checkpoint_last.pt"), "--input", str(tmp_path / "in.txt"), "--cpu"]
    argv += ["--source-lang", "src", "--target-lang", "tgt", str(fairseq_tiny / "data-bin")]
    threads = torch.get_num_threads()
    monkeypatch.setattr(host_cpu, "usable_cpus", lambda: 2)
    monkeypatch.setattr(host_cpu, "load_average", lambda: 1.3)
    try:
        torch.set_num_threads(2)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        with caplog.at_level(logging.INFO, logger="seqtrain.generate"):
            generate_main(argv, out=io.StringIO())
        assert torch.get_num_threads() == 1
        assert (
            "the machine is busy (2 usable CPUs, load 1.3): generation uses 1 intra-op thread" in caplog.text
        )
        torch.set_num_threads(2)
        caplog.clear()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        with caplog.at_level(logging.INFO, logger="seqtrain.generate"):
            generate_main(argv, out=io.StringIO())
        assert torch.get_num_threads() == 2 and "intra-op thread" not in caplog.text
    finally:
        torch.set_num_threads(threads)
