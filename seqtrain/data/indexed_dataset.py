"""fairseq's memory-mapped indexed dataset (`{prefix}.bin` token data + `{prefix}.idx` index), byte for byte.

`.idx` layout as fairseq 0.12 writes it (little-endian; this is what fairseq-preprocess produces and reads):
    magic b"MMIDIDX\\x00\\x00" | version <Q (=1) | dtype code <B | item count <Q |
    sizes int32[count] | pointers int64[count] (byte offset of each item in .bin)
(Megatron-LM's variant adds a document count and doc_idx; fairseq's files have none.)
`.bin` is the items' tokens back to back in that dtype. Reading an item is O(1): both files are memory-mapped.
"""

from __future__ import annotations

import array
import json
import os
import shutil
import struct
from collections.abc import Sequence

import numpy as np
import torch

from seqtrain.config import setting, settings
from seqtrain.errors import SeqtrainError
from seqtrain.fileio import Output, atomic_write

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8  # magic, version, dtype code, count

# fairseq's table; 6 and 7 are both float64 (np.float / np.double), and writing picks the first match.
CODE_TO_DTYPE = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.double,
    8: np.uint16,
    9: np.uint32,
    10: np.uint64,
}


def dtype_code(dtype) -> int:
    dt = np.dtype(dtype)
    for code, d in CODE_TO_DTYPE.items():
        if np.dtype(d) == dt:
            return code
    raise ValueError(f"dtype {dt} has no code in fairseq's indexed dataset format")


def best_fitting_dtype(vocab_size: int | None) -> type:
    """The smallest token dtype fairseq would pick for a vocabulary (uint16 below 65500 symbols)."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def index_file_path(prefix: str) -> str:
    return prefix + ".idx"


def data_file_path(prefix: str) -> str:
    return prefix + ".bin"


def _memmap(path: str, dtype, offset: int, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, dtype=dtype)  # mmap cannot map zero bytes
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


class MMapIndex:
    """The parsed, validated `.idx` file: dtype, sizes (int32) and pointers (int64), memory-mapped."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                header = f.read(HEADER_SIZE)
                file_size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise SeqtrainError(f"{path}: index file not found") from None
        if header[: len(MAGIC)] != MAGIC and not (len(header) < len(MAGIC) and MAGIC.startswith(header)):
            raise SeqtrainError(
                f"{path}: not a fairseq mmap index (bad magic {header[:9]!r}); expected "
                f"{MAGIC!r}, as written by fairseq-preprocess --dataset-impl mmap"
            )
        if len(header) < HEADER_SIZE:
            raise SeqtrainError(f"{path}: truncated index ({file_size} bytes, header needs {HEADER_SIZE})")
        (version,) = struct.unpack("<Q", header[9:17])
        if version != VERSION:
            raise SeqtrainError(f"{path}: unsupported index version {version} (only {VERSION} is known)")
        code = header[17]
        if code not in CODE_TO_DTYPE:
            raise SeqtrainError(f"{path}: unknown dtype code {code} in index header")
        self.dtype = np.dtype(CODE_TO_DTYPE[code])
        (count,) = struct.unpack("<Q", header[18:26])
        expected = HEADER_SIZE + count * (4 + 8)
        if file_size != expected:
            state = "truncated" if file_size < expected else "has trailing bytes"
            raise SeqtrainError(f"{path}: index {state}: {file_size} bytes, {count} items need {expected}")
        # Plain ndarray views of the maps: no copy, but results of arithmetic on them are ordinary arrays.
        self.sizes = np.asarray(_memmap(path, np.int32, HEADER_SIZE, count))
        self.pointers = np.asarray(_memmap(path, np.int64, HEADER_SIZE + 4 * count, count))

    def __len__(self) -> int:
        return len(self.sizes)

    def data_nbytes(self) -> int:
        """Bytes of `.bin` this index describes; also checks that pointers tile the data back to back."""
        if len(self) == 0:
            return 0
        nbytes = self.sizes.astype(np.int64) * self.dtype.itemsize
        if (
            (self.sizes < 0).any()
            or self.pointers[0] != 0
            or not np.array_equal(self.pointers[1:], np.cumsum(nbytes[:-1]))
        ):
            raise SeqtrainError(f"{self.path}: corrupt index (sizes and pointers disagree)")
        return int(self.pointers[-1] + nbytes[-1])


class MMapIndexedDataset(torch.utils.data.Dataset):
    """Items of a `.bin/.idx` pair as LongTensors; picklable (reopens the files in a worker)."""

    def __init__(self, prefix: str):
        self._open(os.fspath(prefix))

    def _open(self, prefix: str) -> None:
        self.prefix = prefix
        self._index = MMapIndex(index_file_path(prefix))
        bin_path = data_file_path(prefix)
        need = self._index.data_nbytes()
        try:
            have = os.path.getsize(bin_path)
        except FileNotFoundError:
            raise SeqtrainError(
                f"{bin_path}: data file not found (its index {index_file_path(prefix)} exists)"
            ) from None
        if have != need:
            state = "truncated" if have < need else "longer than its index says"
            raise SeqtrainError(f"{bin_path}: data file {state}: {have} bytes, index needs {need}")
        self._itemsize = self._index.dtype.itemsize
        self._data = _memmap(bin_path, self._index.dtype, 0, need // self._itemsize)

    def __getstate__(self) -> dict:
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self._open(state["prefix"])

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = int(self._index.pointers[i]) // self._itemsize
        arr = np.array(self._data[start : start + int(self._index.sizes[i])], dtype=np.int64)
        return torch.from_numpy(arr)

    @property
    def sizes(self) -> np.ndarray:
        return self._index.sizes

    @property
    def dtype(self) -> np.dtype:
        return self._index.dtype

    def num_tokens(self, i: int) -> int:
        return int(self._index.sizes[i])

    def size(self, i: int) -> int:
        return int(self._index.sizes[i])

    @staticmethod
    def exists(prefix: str) -> bool:
        return os.path.exists(index_file_path(prefix)) and os.path.exists(data_file_path(prefix))


def write_index(path: str, dtype, sizes: Sequence[int]) -> None:
    """Write a fairseq `.idx` atomically (pointers are derived from sizes)."""
    sizes_arr = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes_arr), dtype=np.int64)
    if len(sizes_arr) > 1:
        np.cumsum(sizes_arr[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    with atomic_write(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", dtype_code(dtype)))
        f.write(struct.pack("<Q", len(sizes_arr)))
        f.write(sizes_arr.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))


class MMapIndexedDatasetBuilder:
    """Streams items into `bin_path` (a temp file until `finalize`, so a crash leaves no valid-looking data).

    Use as a context manager to discard the temp file on error, or call `finalize(idx_path)` / `abort()`.
    """

    def __init__(self, bin_path: str, dtype=np.int64):
        self.bin_path = os.fspath(bin_path)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # reject dtypes fairseq cannot name, now rather than at finalize
        self._out = Output(self.bin_path, "wb")  # a temporary file next to it (or the stream it names)
        self._file = self._out.file
        self._sizes = array.array("i")  # int32, 4 bytes a line: a 10M-line corpus costs 40 MB here, not 300+
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            self._range = (int(info.min), int(info.max))
        else:
            self._range = None

    def __enter__(self) -> MMapIndexedDatasetBuilder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def add_item(self, tensor: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        src = tensor.numpy() if torch.is_tensor(tensor) else np.asarray(tensor)
        if (
            self._range is not None
            and src.size
            and (src.min() < self._range[0] or src.max() > self._range[1])
        ):
            raise ValueError(f"token ids {int(src.min())}..{int(src.max())} do not fit {self.dtype}")
        arr = np.ascontiguousarray(src, dtype=self.dtype).reshape(-1)
        self._file.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)

    def merge_file_(self, other_prefix: str) -> None:
        """Append another dataset (e.g. one worker's shard) written with the same dtype."""
        other = MMapIndexedDataset(other_prefix)  # validates both files
        if other.dtype != self.dtype:
            raise SeqtrainError(
                f"{index_file_path(other_prefix)}: dtype {other.dtype} differs from {self.dtype}"
            )
        self._sizes.frombytes(np.ascontiguousarray(other.sizes, dtype=np.int32).tobytes())
        with open(data_file_path(other_prefix), "rb") as f:
            shutil.copyfileobj(f, self._file)

    def finalize(self, idx_path: str) -> None:
        """Publish the `.bin`, then the `.idx` (so an index never points at missing data)."""
        self._out.commit()
        write_index(os.fspath(idx_path), self.dtype, np.frombuffer(self._sizes, dtype=np.int32))

    def abort(self) -> None:
        self._out.discard()


def make_builder(prefix: str, vocab_size: int | None) -> MMapIndexedDatasetBuilder:
    """A builder for `{prefix}.bin` with the dtype fairseq would pick for this vocabulary size."""
    return MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=best_fitting_dtype(vocab_size))


# ---------------------------------------------------------------------------------------------- token id checks
FULL_CHECK_BYTES = 64 << 20  # a .bin up to this size is checked whole; a larger one by SAMPLE_BLOCKS blocks
SAMPLE_BLOCKS, SAMPLE_BLOCK_ITEMS = 64, 1 << 15


def recorded_max_id(prefix: str) -> int | None:
    """The largest token id preprocess.json (seqtrain-preprocess) recorded for the file `prefix`, if any."""
    folder, name = os.path.split(prefix)
    # {split}.{src}-{tgt}.{lang}, or {split} alone (seqtrain-preprocess --only-source without -s: side "source")
    split, lang = name.split(".")[0], (name.split(".")[-1] if "." in name else "source")
    try:
        with open(os.path.join(folder, "preprocess.json"), encoding="utf-8") as f:
            value = json.load(f)["splits"][split][lang]["max_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


@settings
class DataCheckConfig:
    """Common: how thoroughly an opened data-bin split is checked against its dictionary (check_token_ids)"""

    check_data: bool = setting(
        False,
        "check every token id of each opened data-bin split against its dictionary (default: the maximum "
        "id preprocess.json recorded, the whole .bin when under 64 MiB, else samples)",
        action="store_true",
    )


def check_token_ids(ds: MMapIndexedDataset, vocab_size: int, dict_path: str, full: bool = False) -> None:
    """Refuse a split holding a token id that is not an index of its dictionary (a .bin from another data-bin,
    or damaged), when it is opened rather than as an IndexError hours into training. Cheap: the maximum id
    preprocess.json recorded, plus the whole .bin when it is small (or `full`), else evenly spread samples."""
    bin_path = data_file_path(ds.prefix)
    where = f"; it does not belong to {dict_path} ({vocab_size} symbols): run seqtrain-preprocess again"
    recorded = recorded_max_id(ds.prefix)
    if recorded is not None and recorded >= vocab_size:
        raise SeqtrainError(f"{bin_path}: preprocess.json records token id {recorded}{where}")
    data = ds._data
    if full or data.nbytes <= FULL_CHECK_BYTES:
        step = SAMPLE_BLOCK_ITEMS * 32
        blocks = [data[i : i + step] for i in range(0, len(data), step)]
    else:
        starts = np.linspace(0, len(data) - SAMPLE_BLOCK_ITEMS, SAMPLE_BLOCKS).astype(np.int64)
        blocks = [data[s : s + SAMPLE_BLOCK_ITEMS] for s in starts]
    for block in blocks:
        if len(block) and (int(block.max()) >= vocab_size or int(block.min()) < 0):
            bad = int(block.max()) if int(block.max()) >= vocab_size else int(block.min())
            raise SeqtrainError(f"{bin_path}: token id {bad} is out of range{where}")
