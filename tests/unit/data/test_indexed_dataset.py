import os
import pickle
import struct

import numpy as np
import pytest
import torch

from seqtrain.data.dictionary import Dictionary, iter_lines
from seqtrain.data.indexed_dataset import (
    MAGIC,
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    best_fitting_dtype,
    dtype_code,
    make_builder,
)
from seqtrain.errors import SeqtrainError

ITEMS = [[5, 6, 7, 2], [2], [], [65000, 1, 2], list(range(4, 30))]


def write(prefix, items, dtype=np.uint16):
    b = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for it in items:
        b.add_item(torch.tensor(it, dtype=torch.int64))
    b.finalize(prefix + ".idx")
    return prefix


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_write_read_equality(tmp_path, dtype):
    items = [[x % 250 for x in it] for it in ITEMS] if dtype == np.uint8 else ITEMS
    prefix = write(str(tmp_path / "d"), items, dtype)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == len(items) and ds.dtype == np.dtype(dtype)
    assert ds.sizes.dtype == np.int32 and ds.sizes.tolist() == [len(i) for i in items]
    for i, it in enumerate(items):
        t = ds[i]
        assert t.dtype == torch.int64 and t.tolist() == it
    assert os.path.getsize(prefix + ".bin") == sum(map(len, items)) * np.dtype(dtype).itemsize
    assert MMapIndexedDataset.exists(prefix) and not MMapIndexedDataset.exists(prefix + "x")
    again = pickle.loads(pickle.dumps(ds))
    assert [again[i].tolist() for i in range(len(items))] == items


def test_empty_dataset(tmp_path):
    prefix = write(str(tmp_path / "e"), [])
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 0 and ds.sizes.tolist() == [] and os.path.getsize(prefix + ".idx") == 26


def test_header_byte_layout(tmp_path):
    prefix = write(str(tmp_path / "d"), ITEMS, np.uint16)
    raw = open(prefix + ".idx", "rb").read()
    n = len(ITEMS)
    assert raw[:9] == b"MMIDIDX\x00\x00" == MAGIC
    assert struct.unpack("<Q", raw[9:17]) == (1,)
    assert raw[17] == 8  # uint16 in fairseq's code table
    assert struct.unpack("<Q", raw[18:26]) == (n,)
    assert list(struct.unpack(f"<{n}i", raw[26 : 26 + 4 * n])) == [4, 1, 0, 3, 26]
    assert list(struct.unpack(f"<{n}q", raw[26 + 4 * n :])) == [0, 8, 10, 10, 16]
    assert len(raw) == 26 + 12 * n
    assert open(prefix + ".bin", "rb").read(10) == struct.pack("<5H", 5, 6, 7, 2, 2)


def test_dtype_table_and_best_fit():
    assert [
        dtype_code(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.uint16)
    ] == [1, 2, 3, 4, 5, 6, 8]
    assert best_fitting_dtype(208) == np.uint16 and best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32 and best_fitting_dtype(250000) == np.int32


def test_add_item_rejects_ids_that_do_not_fit(tmp_path):
    with MMapIndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16) as b:
        with pytest.raises(ValueError, match="do not fit uint16"):
            b.add_item(torch.tensor([1, 70000]))
        b.abort()
    assert os.listdir(tmp_path) == []


def test_builder_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with MMapIndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16) as b:
            b.add_item(torch.tensor([1, 2]))
            raise RuntimeError("worker died")
    assert os.listdir(tmp_path) == []


def test_merge_shards_equals_single_pass(tmp_path):
    single = write(str(tmp_path / "single"), ITEMS)
    write(str(tmp_path / "s0"), ITEMS[:2])
    write(str(tmp_path / "s1"), ITEMS[2:])
    b = MMapIndexedDatasetBuilder(str(tmp_path / "merged.bin"), dtype=np.uint16)
    b.merge_file_(str(tmp_path / "s0"))
    b.merge_file_(str(tmp_path / "s1"))
    b.finalize(str(tmp_path / "merged.idx"))
    for ext in (".bin", ".idx"):
        assert open(str(tmp_path / "merged") + ext, "rb").read() == open(single + ext, "rb").read()
    write(str(tmp_path / "wide"), ITEMS, np.int32)
    with pytest.raises(SeqtrainError, match=r"wide\.idx: dtype int32 differs from uint16"):
        MMapIndexedDatasetBuilder(str(tmp_path / "m2.bin"), dtype=np.uint16).merge_file_(
            str(tmp_path / "wide")
        )


def corrupt_cases():
    def patch(offset, data):
        return lambda raw: raw[:offset] + data + raw[offset + len(data) :]

    return [
        ("idx", patch(0, b"NOTANIDX\x00"), r"d\.idx: not a fairseq mmap index"),
        ("idx", lambda raw: b"", r"d\.idx: truncated index"),
        ("idx", lambda raw: raw[:20], r"d\.idx: truncated index"),
        ("idx", patch(9, struct.pack("<Q", 2)), r"d\.idx: unsupported index version 2"),
        ("idx", patch(17, b"\x63"), r"d\.idx: unknown dtype code 99"),
        ("idx", lambda raw: raw[:-5], r"d\.idx: index truncated"),
        ("idx", lambda raw: raw + b"\x00", r"d\.idx: index has trailing bytes"),
        ("idx", patch(26 + 4 * 5 + 8, struct.pack("<q", 9)), r"d\.idx: corrupt index"),
        ("bin", lambda raw: raw[:-2], r"d\.bin: data file truncated"),
        ("bin", lambda raw: raw + b"\x00\x00", r"d\.bin: data file longer than its index says"),
    ]


@pytest.mark.parametrize("which,mutate,message", corrupt_cases())
def test_corrupt_files_raise_naming_the_file(tmp_path, which, mutate, message):
    prefix = write(str(tmp_path / "d"), ITEMS)
    path = f"{prefix}.{which}"
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(mutate(raw))
    with pytest.raises(SeqtrainError, match=message):
        MMapIndexedDataset(prefix)


def test_missing_files(tmp_path):
    with pytest.raises(SeqtrainError, match=r"nope\.idx: index file not found"):
        MMapIndexedDataset(str(tmp_path / "nope"))
    prefix = write(str(tmp_path / "d"), ITEMS)
    os.unlink(prefix + ".bin")
    with pytest.raises(SeqtrainError, match=r"d\.bin: data file not found"):
        MMapIndexedDataset(prefix)


def test_reading_is_memory_mapped(tmp_path):
    prefix = write(str(tmp_path / "d"), ITEMS)
    ds = MMapIndexedDataset(prefix)
    assert isinstance(ds._data, np.memmap)
    assert (
        not ds.sizes.flags.owndata and not ds.sizes.flags.writeable
    )  # a view of the mapped .idx, not a copy


def test_rebinarize_fixture_byte_identical(fairseq_tiny, tmp_path):
    d = Dictionary.load(str(fairseq_tiny / "data-bin" / "dict.src.txt"))
    for split in ("train", "valid"):
        for lang in ("src", "tgt"):
            name = f"{split}.src-tgt.{lang}"
            with make_builder(str(tmp_path / name), len(d)) as b:
                for line in iter_lines(str(fairseq_tiny / "raw" / f"{split}.{lang}")):
                    b.add_item(d.encode_line(line, append_eos=True))
                b.finalize(str(tmp_path / name) + ".idx")
            for ext in (".bin", ".idx"):
                mine = (tmp_path / (name + ext)).read_bytes()
                assert mine == (fairseq_tiny / "data-bin" / (name + ext)).read_bytes(), name + ext


def test_fixture_reads(fairseq_tiny):
    ds = MMapIndexedDataset(str(fairseq_tiny / "data-bin" / "train.src-tgt.tgt"))
    assert len(ds) == 3000 and ds.dtype == np.uint16
    assert (ds.sizes == 6).all()  # 5 target tokens + </s>
    assert int(ds.sizes.sum()) == 18000 and ds[2999].tolist()[-1] == 2
