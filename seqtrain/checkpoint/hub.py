"""Hugging Face hub names for every flag that takes a model (`--restore-file`, `--finetune-from-model`, `--path`,
`Summarizer.from_pretrained`, seqtrain-convert's input): `org/name` or `org/name@revision` (a branch, tag or
40-hex commit) becomes a folder of huggingface_hub's cache, downloaded there when needed.

    >>> resolve_model_path("facebook/bart-large-cnn", "--path")  # .../models--facebook--bart-large-cnn/snapshots/SHA
    >>> resolve_model_path("org/fairseq-bart@v1", "--path")      # a fairseq repo: .../snapshots/SHA/model.pt

A local path that exists always wins, so `checkpoints/checkpoint_best.pt` never reaches the hub; names ending
like checkpoint files (`.pt`, `.bin`, ...) or starting with an existing local folder are local paths too. The
cache is huggingface_hub's own: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, read when a
name is resolved (so a test or a launcher can set it late); `HF_HUB_OFFLINE=1` reads the cache only.
huggingface_hub itself is optional: only a hub name needs it.
"""

from __future__ import annotations

import os
import re

from seqtrain.errors import SeqtrainError

# org/name[@revision]; huggingface_hub's own id rule (word characters, '-', '.'; no '--' or '..') is checked below
_HUB_NAME = re.compile(r"^([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?$")
_LOCAL_SUFFIXES = (".pt", ".bin", ".safetensors", ".json", ".txt", ".model")
# What a model folder needs besides its weights: configs, dictionaries, tokenizer files
_META_FILES = ["*.json", "*.txt", "*.model", "vocab.bpe"]
# Weights, first choice: safetensors (Hugging Face) or model.pt (fairseq); pytorch_model.bin only without them
_FIRST_WEIGHTS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors", "model.pt"]
_FALLBACK_WEIGHTS = ["pytorch_model.bin"]


def parse_hub_name(path: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `path` reads as a hub name and names nothing local; else None."""
    if not isinstance(path, str) or os.path.exists(path):
        return None
    m = _HUB_NAME.match(path)
    if m is None:
        return None
    repo, revision = m.group(1), m.group(2)
    if "--" in repo or ".." in repo or repo.endswith(_LOCAL_SUFFIXES) or os.path.isdir(repo.split("/")[0]):
        return None
    return repo, revision


def hub_cache_dir() -> str:
    """huggingface_hub's cache folder as its environment variables say now (its own constants are read once, at
    import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve_model_path(path: str, flag: str = "model") -> str:
    """`path` itself when it exists or is no hub name; else the cached snapshot of the hub model it names: the
    folder for a Hugging Face model (config.json), its model.pt for a fairseq one (dict.txt beside it).
    `flag` names where the path came from in errors."""
    hub = parse_hub_name(path)
    if hub is None:
        return path
    folder = _snapshot(path, *hub, flag)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    if os.path.isfile(os.path.join(folder, "model.pt")):
        return os.path.join(folder, "model.pt")
    raise SeqtrainError(
        f"{flag} {path}: the hub snapshot {folder} holds neither config.json (Hugging Face) nor model.pt (fairseq)"
    )


def _has_weights(folder: str) -> bool:
    names = ("model.safetensors", "model.safetensors.index.json", "model.pt")
    return any(os.path.isfile(os.path.join(folder, n)) for n in names)


def _snapshot(name: str, repo: str, revision: str | None, flag: str) -> str:
    """The snapshot folder of `repo` at `revision` in the cache: safetensors (or model.pt) fetched when the repo
    has them, pytorch_model.bin only when it does not."""
    try:
        # optional dependency: only hub names need it (pip install huggingface_hub)
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise SeqtrainError(
            f"{flag} {name}: no such local path, and reading it as a Hugging Face hub name needs huggingface_hub "
            "(pip install huggingface_hub)"
        ) from None
    cache, offline = hub_cache_dir(), hub_offline()
    kw = dict(revision=revision, cache_dir=cache, local_files_only=offline)
    try:
        folder = huggingface_hub.snapshot_download(repo, allow_patterns=_META_FILES + _FIRST_WEIGHTS, **kw)
        if not _has_weights(folder):
            folder = huggingface_hub.snapshot_download(
                repo, allow_patterns=_META_FILES + _FALLBACK_WEIGHTS, **kw
            )
    except LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise SeqtrainError(
            f"{flag} {name}: hub model {repo} (revision {revision or 'main'}) is not in the Hugging Face cache "
            f"{cache} and {how}; download it once online (hf download {repo}) or give a local path"
        ) from None
    except (OSError, ValueError) as e:  # repository or revision not found, HTTP errors, invalid ids
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SeqtrainError(f"{flag} {name}: cannot fetch hub model {repo} ({first})") from None
    return folder
