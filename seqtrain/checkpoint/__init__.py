"""Checkpoints in every format seqtrain reads and writes, behind one door.

    native.py    seqtrain's own format (what training saves; resumes bitwise)
    fairseq.py   fairseq's model.pt / checkpoint*.pt, with the dict.txt beside it
    hf.py        Hugging Face BART folders (config.json + safetensors or pytorch_model.bin)
    hf_files.py  the rest of an export transformers loads whole: tokenizer files, generation_config.json, README.md
    files.py     the file itself: atomic save, the safe reader (weights_only + allowlist, CRC, mmap)
    checks.py    what a checkpoint claims, checked against what it holds, before a model is built
    formats.py   which format a path is, `read_checkpoint` for any of them, `EXPORTERS` for each
    load.py      a model from any checkpoint (`load_model`, `LoadedModel`)
    convert.py   seqtrain-convert: any format into any other
    options.py   the Checkpoint flags of a training run (CheckpointConfig)

Every reader ends in `CheckpointContents` (fairseq's arg and parameter names, the dictionaries when known).
"""

from seqtrain.checkpoint.files import CheckpointContents, load_checkpoint_file, save_checkpoint_file
from seqtrain.checkpoint.formats import EXPORTERS, FORMATS, detect_format, read_checkpoint
from seqtrain.checkpoint.load import LoadedModel, load_model

__all__ = [
    "EXPORTERS",
    "FORMATS",
    "CheckpointContents",
    "LoadedModel",
    "detect_format",
    "load_checkpoint_file",
    "load_model",
    "read_checkpoint",
    "save_checkpoint_file",
]
