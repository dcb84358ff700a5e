"""Scoring of generated text: ROUGE (wrapping Google's rouge-score)."""

from seqtrain.scoring.rouge import (
    ROUGE_TYPES,
    bootstrap_intervals,
    example_scores,
    format_summary,
    paired_bootstrap,
    score_files,
    score_pairs,
    split_sentences,
    write_json,
)

__all__ = [
    "ROUGE_TYPES",
    "bootstrap_intervals",
    "example_scores",
    "format_summary",
    "paired_bootstrap",
    "score_files",
    "score_pairs",
    "split_sentences",
    "write_json",
]
