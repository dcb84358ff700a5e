"""Models: transformer layers and BART. Importing this package registers the `bart_*` archs in ARCHS."""

from seqtrain.models.bart import BartConfig, BARTModel, add_args, as_built, build_model

__all__ = ["BARTModel", "BartConfig", "add_args", "as_built", "build_model"]
