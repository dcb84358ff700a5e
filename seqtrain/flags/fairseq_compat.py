"""fairseq command-line flags that seqtrain takes with fairseq's meaning, and the error for those it lacks.

- `--user-dir DIR` imports DIR as a Python package before the flags are parsed, as fairseq's
  import_user_module does, so its modules can register archs, tasks, criterions, optimizers and lr schedulers
  in seqtrain.registry (and the flags they add exist).
- `--amp`: fairseq's automatic mixed precision (fp16 autocast with a dynamic grad scaler); seqtrain's --fp16 is
  exactly that, so --amp implies it.
- `--dataset-impl`: only mmap, the format fairseq writes by default and seqtrain-preprocess writes.
- `--bpe sentencepiece --sentencepiece-model M` / `--bpe gpt2 [--gpt2-encoder-json J --gpt2-vocab-bpe B]`: fairseq
  names the tokenizer (e.g. for --task denoising's word starts); seqtrain reads it from the data-bin
  (tokenizer.json). The flags are accepted where they name the data-bin's own tokenizer (the same file bytes) and
  refused with one line where they differ (`databin_tokenizer`); on a fairseq data-bin, which has no tokenizer.json,
  the model they name becomes the data-bin's tokenizer once the dictionary's symbols are checked to be its tokens.
- A fairseq-train / fairseq-generate flag seqtrain does not implement is refused naming it (the list comes from
  fairseq 0.12's own parsers: seqtrain/flags/fairseq_flag_list.py, written by scripts/dev/fairseq_flags.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.flags.fairseq_flag_list import FAIRSEQ_FLAGS

_imported: dict[str, str] = {}  # absolute --user-dir path -> module name


def import_user_dir(path: str) -> None:
    """Import folder `path` as a package (its __init__.py imports its modules) once per process."""
    full = os.path.abspath(path)
    if full in _imported:
        return
    if not os.path.isdir(full):
        raise SeqtrainError(f"--user-dir {path}: folder not found")
    if not os.path.isfile(os.path.join(full, "__init__.py")):
        raise SeqtrainError(f"--user-dir {path}: not a Python package (no __init__.py in it)")
    parent, name = os.path.split(full)
    loaded = sys.modules.get(name)
    if loaded is not None and full not in list(getattr(loaded, "__path__", [])):
        raise SeqtrainError(
            f"--user-dir {path}: a different module named {name!r} is already imported; rename the folder"
        )
    if loaded is None:
        sys.path.insert(0, parent)
        try:
            importlib.import_module(name)
        except SeqtrainError:
            raise
        except Exception as e:
            raise SeqtrainError(f"--user-dir {path}: importing it failed: {type(e).__name__}: {e}") from None
    _imported[full] = name


def import_user_dir_of(argv: Sequence[str]) -> None:
    """Import the --user-dir of a command line before any parser is built (both `--user-dir X` and
    `--user-dir=X`)."""
    for i, arg in enumerate(argv):
        if arg == "--user-dir" and i + 1 < len(argv):
            import_user_dir(argv[i + 1])
        elif arg.startswith("--user-dir="):
            import_user_dir(arg.split("=", 1)[1])


def dataset_impl(value: str) -> str:
    if value != "mmap":
        raise argparse.ArgumentTypeError(
            f"only mmap is supported (fairseq's default binary format, which seqtrain-preprocess writes); "
            f"got {value!r}"
        )
    return value


def add_args(parser: argparse.ArgumentParser) -> None:
    """The fairseq flags of this module, on seqtrain-train's and seqtrain-generate's parsers."""
    g = parser.add_argument_group("fairseq compatibility")
    g.add_argument(
        "--user-dir",
        default=None,
        metavar="DIR",
        help="import DIR (a Python package) first: its modules may register archs, tasks, criterions, "
        "optimizers and lr schedulers (seqtrain.registry), as fairseq's --user-dir",
    )
    g.add_argument(
        "--amp",
        action="store_true",
        help="fairseq's automatic mixed precision: fp16 autocast with a dynamic grad scaler, i.e. --fp16 (CUDA)",
    )
    g.add_argument(
        "--bpe",
        choices=("sentencepiece", "gpt2"),
        default=None,
        help="fairseq's tokenizer choice: accepted where it is the data-bin's own tokenizer (checked), as fairseq's "
        "--task denoising commands give it; seqtrain reads the tokenizer from the data-bin",
    )
    g.add_argument(
        "--sentencepiece-model",
        metavar="FILE",
        help="with --bpe sentencepiece: the data-bin's spm model (checked)",
    )
    g.add_argument(
        "--gpt2-encoder-json", metavar="FILE", help="with --bpe gpt2: the data-bin's encoder.json (checked)"
    )
    g.add_argument(
        "--gpt2-vocab-bpe", metavar="FILE", help="with --bpe gpt2: the data-bin's vocab.bpe (checked)"
    )
    g.add_argument(
        "--dataset-impl",
        type=dataset_impl,
        default="mmap",
        metavar="FORMAT",
        help="data-bin format; only mmap (fairseq's default)",
    )


def _component_flags() -> set[str]:
    """The flags of every optimizer and lr scheduler seqtrain has (a parser holds only the chosen ones')."""
    from seqtrain.optim import lr_scheduler, optimizers  # imports torch: only an unknown flag pays for it

    parser = argparse.ArgumentParser(add_help=False)
    optimizers.add_args(parser)
    lr_scheduler.add_args(parser)
    return set(parser._option_string_actions)


def unrecognized_message(stage: str | None, message: str) -> str:
    """argparse's "unrecognized arguments: ..." of seqtrain-train (`stage` "train") or seqtrain-generate, with
    the fairseq flags among them named as such."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix) or stage not in ("train", "generate"):
        return message
    tool = f"fairseq-{stage}"
    named: list[str] = []
    for arg in message[len(prefix) :].split():
        flag = arg.split("=", 1)[0]
        tools = FAIRSEQ_FLAGS.get(flag, ((),))[0]
        if stage == "train" and flag in _component_flags():
            named.append(f"{flag} belongs to another --optimizer or --lr-scheduler than the chosen one")
        elif tool in tools:
            named.append(f"{flag} is a {tool} flag that seqtrain does not implement")
        elif tools:
            named.append(f"{flag} is a {' and '.join(tools)} flag, not a {tool} one")
    if not named:
        return message
    return f"{message}: {'; '.join(named)} (docs/fairseq.md lists fairseq's flags)"


def apply(args: Any) -> None:
    """After parsing: --amp means --fp16."""
    if getattr(args, "amp", False):
        args.fp16 = True
