"""seqtrain: fairseq-style sequence-to-sequence training for BART summarization."""

__version__ = "0.1.0"
