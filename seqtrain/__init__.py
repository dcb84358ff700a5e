"""seqtrain: fairseq-style sequence-to-sequence training for BART summarization.

The public face: `seqtrain.Summarizer` (text in, summaries out) and `seqtrain.load_model` (a model from any
checkpoint seqtrain reads). Both are imported on first use, so `import seqtrain` stays cheap."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Summarizer", "__version__", "load_model"]


def __getattr__(name: str) -> Any:
    if name == "Summarizer":
        from seqtrain.generation.summarizer import (
            Summarizer,  # on first use: `import seqtrain` stays free of torch
        )

        return Summarizer
    if name == "load_model":
        from seqtrain.checkpoint.load import load_model  # on first use, likewise

        return load_model
    raise AttributeError(f"module 'seqtrain' has no attribute {name!r}")
