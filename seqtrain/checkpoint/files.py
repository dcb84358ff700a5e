"""Checkpoint files: atomic save, safe load, and the one shape every format's reader ends in.

Every reader (`seqtrain.checkpoint.native` for seqtrain's own files, `seqtrain.checkpoint.fairseq`,
`seqtrain.checkpoint.hf`) ends in `CheckpointContents`: model args with fairseq's names, a state dict with
fairseq's parameter names (seqtrain's names are fairseq's), and the dictionaries when known.
`seqtrain.checkpoint.formats.read_checkpoint` reads any of them; `seqtrain.checkpoint.load` builds models from
the contents.

Loading is safe by default: `torch.load(weights_only=True)` with an allowlist of the few classes that our own
and fairseq's checkpoints legitimately pickle (argparse.Namespace, numpy scalars). Anything else needs
`unsafe=True` (`--unsafe-load`), because arbitrary unpickling can run code.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seqtrain.errors import SeqtrainError
from seqtrain.fileio import atomic_write, file_kind

logger = logging.getLogger("seqtrain.checkpoint")


def _numpy_safe_globals() -> list:
    # fairseq stored some scalars (best loss, meters) as numpy scalars; these rebuild a number from a dtype
    # and raw bytes, nothing more. Pickles written under numpy 1 name the function
    # numpy.core.multiarray.scalar.
    scalar = np._core.multiarray.scalar if hasattr(np, "_core") else np.core.multiarray.scalar
    items: list = [scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype]
    for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType", "BoolDType"):
        cls = getattr(getattr(np, "dtypes", None), name, None)
        if cls is not None:
            items.append(cls)
    return items


SAFE_GLOBALS: list = [argparse.Namespace] + _numpy_safe_globals()


# ------------------------------------------------------------------------------------------------- file level
def save_checkpoint_file(state: dict[str, Any], path: str) -> None:
    """torch.save `state` to `path` atomically: a crash or error mid-write leaves any old file intact."""
    try:
        with atomic_write(path, "wb") as f:
            torch.save(state, f)
    except RuntimeError as e:
        # an error inside torch.save's write (a Ctrl-C, a full disk) comes out as RuntimeError("... unexpected
        # pos ...") raised while handling it: give the interrupt back, and the OS error with the path it was
        # writing (the temporary file is already removed)
        if isinstance(e.__context__, KeyboardInterrupt):
            raise e.__context__ from None
        if isinstance(e.__context__, OSError):
            cause = e.__context__
            raise OSError(cause.errno, cause.strerror or str(cause), path) from None
        raise


def _sniff(path: str) -> bool:
    """Reject what cannot be a torch checkpoint before torch gives a confusing message about it. Returns
    whether it is a zip archive (torch >= 1.6), the format torch.load can memory-map."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise SeqtrainError(f"checkpoint not found: {path}") from None
    if stat.S_ISDIR(mode):
        raise SeqtrainError(f"{path} is a directory, expected a checkpoint file")
    if not stat.S_ISREG(mode):  # opening a FIFO would wait for a writer for ever; a device reads anything
        raise SeqtrainError(f"{path} is {file_kind(mode)}, not a checkpoint file; give a regular file")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise SeqtrainError(f"{path} is empty, not a checkpoint")
    # zip archive (torch >= 1.6) or the legacy format, which starts with a protocol-2 pickle of a long magic
    # number
    if head != b"PK\x03\x04" and head[:2] != b"\x80\x02":
        raise SeqtrainError(
            f"{path} is not a PyTorch checkpoint (neither a torch zip archive nor a legacy torch file)"
        )
    return head == b"PK\x03\x04"


def _torch_load(path: str, unsafe: bool, mmap: bool) -> Any:
    if unsafe:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def load_checkpoint_file(path: str, unsafe: bool = False, mmap: bool = False) -> Any:
    """torch.load on CPU; with `unsafe=False` only plain data plus `SAFE_GLOBALS` may be unpickled.

    `mmap=True` maps a zip-format file instead of reading it: tensors are read from the file as they are used,
    so the parts a caller never touches (a training checkpoint's optimizer state, twice the weights' size, when
    a model is loaded to generate) cost neither time nor memory. For callers that copy what they keep (a
    model's load_state_dict does): the tensors stay backed by the file until they are dropped. Where mapping
    fails (a file system that cannot map files, or a damaged file), the file is read as without it."""
    mmap = _sniff(path) and mmap
    if unsafe:
        logger.warning(
            f"--unsafe-load: unpickling {path} without restrictions; code inside it can run "
            "(use this only for files you trust)"
        )
    if mmap:
        try:
            return _torch_load(path, unsafe, mmap=True)
        except Exception:
            pass  # read it instead: that works where mapping cannot, and names what is wrong with a bad file
    try:
        return _torch_load(path, unsafe, mmap=False)
    except SeqtrainError:
        raise
    except Exception as e:  # torch raises many types for damaged files; turn each into one clear line
        msg = str(e)
        if not unsafe and ("GLOBAL" in msg or "Unsupported global" in msg):
            try:
                names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            except Exception:
                names = []
            what = f" ({', '.join(names[:5])})" if names else ""
            raise SeqtrainError(
                f"{path} needs arbitrary unpickling{what}, which may run code; "
                f"if you trust this file, pass --unsafe-load (unsafe=True) to load it"
            ) from None
        if "central directory" in msg or isinstance(e, (EOFError, IndexError)) or "zip archive" in msg:
            raise SeqtrainError(
                f"{path} is truncated or corrupted (could not read it as a torch checkpoint)"
            ) from None
        first = msg.strip().splitlines()[0][:200] if msg.strip() else type(e).__name__
        raise SeqtrainError(f"{path} could not be read as a checkpoint: {first}") from None


def _storages(obj: Any, found: dict[int, tuple[str, torch.UntypedStorage]], where: str = "") -> None:
    """Every CPU tensor storage reachable from `obj` (dicts, lists, tuples), by data pointer, with a name."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.device.type == "cpu" and storage.nbytes():
            found.setdefault(storage.data_ptr(), (where or "tensor", storage))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _storages(v, found, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _storages(v, found, f"{where}[{i}]")


def verify_checksums(path: str, tensors: Any, mapped: tuple[str, int, tuple[int, int]] | None = None) -> None:
    """Check what a caller keeps of a loaded zip-format checkpoint against the CRC-32s the archive stores
    (torch.load checks none: a flipped bit in a weight would load silently). `tensors`: the part of the loaded
    object to check (e.g. the model's state dict; a mapped file's other tensors stay unread). The archive's own
    records (data.pkl, the pickled arguments and counters) are checked whole; each storage reachable from
    `tensors` must equal, byte for byte by CRC-32, a data record of its size. Works alike for a mapped and a
    read file (a storage of either holds the record's bytes). A legacy-format file has no checksums: nothing to
    check. Costs one CRC-32 pass over the kept bytes (about 1.6 GB/s on the 2-core development CPU)."""
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as z:
            data_crcs: dict[int, set[int]] = {}
            for info in z.infolist():
                if "/data/" in info.filename and not info.filename.endswith(".pkl"):
                    data_crcs.setdefault(info.file_size, set()).add(info.CRC)
                else:
                    with z.open(info) as f:  # zipfile checks the CRC-32 when the record is read to its end
                        while f.read(1 << 20):
                            pass
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        raise SeqtrainError(f"{path} is truncated or corrupted ({e})") from None
    found: dict[int, tuple[str, torch.UntypedStorage]] = {}
    _storages(tensors, found)
    if mapped is not None:
        check_still_mapped(*mapped)
    for name, storage in found.values():
        view = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
        try:
            crc = zlib.crc32(view.numpy())
        except (OSError, RuntimeError) as e:  # e.g. the mapped file shrank under us
            raise SeqtrainError(f"{path}: could not read weight {name!r} ({e})") from None
        if crc not in data_crcs.get(storage.nbytes(), ()):
            raise SeqtrainError(
                f"{path} is corrupted: the bytes of weight {name!r} fail the archive's CRC-32 checksum "
                "(a damaged copy or disk); use an intact copy of the checkpoint"
            )


def check_finite(path: str, state: dict[str, torch.Tensor]) -> None:
    """Refuse a state dict holding NaN or infinite weights, naming the first such tensor: a model with them
    produces no scores to rank (generation would fail deep inside the search). A tensor's sum is finite only
    when all its elements are, so the common case costs one summing pass; a non-finite sum (possibly an
    overflow of finite values) is checked element by element."""
    for key, t in state.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            continue
        if torch.isfinite(t.sum()) or bool(torch.isfinite(t).all()):
            continue
        bad = int((~torch.isfinite(t)).sum())
        first = t.flatten()[int((~torch.isfinite(t.flatten())).nonzero()[0])].item()
        raise SeqtrainError(
            f"{path}: weight {key!r} holds {bad:,} non-finite value(s) (the first: {first}); the model is "
            "broken (a diverged or damaged run): use an earlier checkpoint"
        )


# --------------------------------------------------------------------------------------------------- contents
@dataclass
class CheckpointContents:
    """A checkpoint of any supported format, translated to seqtrain's names."""

    path: str
    format: str  # "seqtrain" | "fairseq" | "hf"
    args: argparse.Namespace  # model (and data-convention) args with fairseq's names, incl. `arch`
    model: dict[str, torch.Tensor]  # fairseq / seqtrain parameter names
    src_dict: Any = None  # seqtrain.data.dictionary.Dictionary, when known
    tgt_dict: Any = None
    tokenizer: dict | None = None  # a tokenizer spec (seqtrain.data.tokenizer.build_tokenizer)
    # the whole seqtrain checkpoint dict (optimizer, extra_state...) for resuming
    state: dict | None = None
    notes: list[str] = field(default_factory=list)  # what was dropped or adjusted while reading
    # (file, its size, its inode) when `model`'s tensors are still backed by a mapping of the file
    mapped: tuple[str, int, tuple[int, int]] | None = None
    # the generation settings it carries (seqtrain.checkpoint.generation_settings.StoredGeneration), if any
    generation: Any = None


def mapped_identity(path: str) -> tuple[str, int, tuple[int, int]]:
    """(path, size, (device, inode)) of the file about to be mapped, for check_still_mapped."""
    st = os.stat(path)
    return path, st.st_size, (st.st_dev, st.st_ino)


def check_still_mapped(path: str, size: int, inode: tuple[int, int]) -> None:
    """Before mapped tensors of `path` are read: the file (the same inode) must still hold the `size` bytes it
    had when it was mapped. Reading a page of a mapping past the end of a file that was truncated in place kills
    the process with SIGBUS, which no handler can turn into an error (the faulting read would run again), so the
    size is checked before every pass that reads the mapping; a truncation during such a pass is not caught (seqtrain
    itself never writes a checkpoint in place: a new file is renamed over the name, and a mapping keeps the old
    one's bytes)."""
    try:
        st = os.stat(path)
    except OSError:  # removed: the mapping keeps the file's bytes
        return
    if (st.st_dev, st.st_ino) != inode:  # replaced by a rename (a new save): the mapping keeps the old bytes
        return
    now = st.st_size
    if now < size:
        raise SeqtrainError(
            f"{path} shrank from {size:,} to {now:,} bytes while it was being read (truncated in place by "
            "another program?); its weights can no longer be read: rerun once nothing writes to it"
        )


def strip_wrapper_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # DDP ("module.") and torch.compile ("_orig_mod.") wrappers leak into names when saved without unwrapping
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def cpu_state(model_or_state: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model's (or a state dict's) tensors, detached and on CPU, ready to save."""
    state = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) else model_or_state
    return {k: v.detach().cpu() for k, v in state.items()}
