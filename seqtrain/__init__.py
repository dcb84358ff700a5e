"""seqtrain: fairseq-style sequence-to-sequence training for BART summarization.

`seqtrain.Summarizer` (text in, summaries out) is imported on first use, so `import seqtrain` stays cheap."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Summarizer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Summarizer":
        from seqtrain.summarizer import Summarizer

        return Summarizer
    raise AttributeError(f"module 'seqtrain' has no attribute {name!r}")
