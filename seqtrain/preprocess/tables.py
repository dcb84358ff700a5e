"""seqtrain-preprocess --parquet / --load-from-disk: the columnar files Hugging Face datasets live in, read with
pyarrow (an optional extra: `pip install 'seqtrain[data]'`).

--parquet reads PREFIX.parquet (what the Hub serves and `Dataset.to_parquet` writes); --load-from-disk reads the
folder PREFIX that `Dataset.save_to_disk` wrote (state.json listing its Arrow stream files in order, as
`datasets.load_from_disk` reads them; a DatasetDict's folder holds one such folder per split). Only pyarrow is
needed for either: the `datasets` package itself is not imported.

Rows are streamed in record batches, and each --source-key / --target-key value passes the same checks as a JSON
lines value (seqtrain.preprocess.jsonl._value: a string, not empty, line breaks become spaces), so errors read
`FILE:ROW: ...` with ROW counted from 1 like a JSON line, and the line files written are the ones the same pairs
in JSON lines give: the data-bin is byte for byte that of the equivalent line files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from seqtrain.errors import SeqtrainError
from seqtrain.preprocess.jsonl import _value

_BATCH_ROWS = 1024  # rows per record batch read: memory stays flat for any file size


def _pyarrow(flag: str) -> Any:
    try:
        import pyarrow  # optional extra: only --parquet / --load-from-disk need it
        import pyarrow.ipc  # noqa: F401  (submodules the readers below use)
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SeqtrainError(
            f"{flag} needs pyarrow, which is not installed: pip install 'seqtrain[data]' (or pip install pyarrow)"
        ) from None
    return pyarrow


def input_path(fmt: str, prefix: str) -> str:
    """The file or folder a split's PREFIX names for this input format."""
    return f"{prefix}.parquet" if fmt == "parquet" else prefix


def check_exists(fmt: str, flag: str, prefix: str) -> None:
    path = input_path(fmt, prefix)
    if fmt == "parquet":
        if not os.path.isfile(path):
            raise SeqtrainError(f"{flag} {prefix}: input file not found: {path}")
        return
    if not os.path.isdir(path):
        raise SeqtrainError(
            f"{flag} {prefix}: no such folder (--load-from-disk reads Dataset.save_to_disk folders)"
        )
    _arrow_files(path)  # a DatasetDict folder or a folder without state.json: said now, before any work


def _arrow_files(folder: str) -> list[str]:
    """The Arrow files of a save_to_disk folder, in the order state.json lists them."""
    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        dict_json = os.path.join(folder, "dataset_dict.json")
        if os.path.isfile(dict_json):
            try:
                with open(dict_json, encoding="utf-8") as f:
                    splits = json.load(f).get("splits", [])
            except (OSError, ValueError, AttributeError):
                splits = []
            shown = ", ".join(os.path.join(folder, s) for s in splits) or "its split folders"
            raise SeqtrainError(
                f"{folder}: a DatasetDict folder; give one split's folder as the prefix ({shown})"
            )
        raise SeqtrainError(f"{folder}: no state.json (not a folder written by Dataset.save_to_disk)")
    try:
        with open(state, encoding="utf-8") as f:
            files = [d["filename"] for d in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise SeqtrainError(f"{state}: unreadable (expected save_to_disk's '_data_files' list)") from None
    if not files:
        raise SeqtrainError(f"{state}: lists no data files")
    paths = [os.path.join(folder, name) for name in files]
    for p in paths:
        if not os.path.isfile(p):
            raise SeqtrainError(f"{state}: lists {os.path.basename(p)}, which is not in the folder")
    return paths


def _columns(path: str, schema: Any, keys: list[str], pa: Any) -> None:
    names = list(schema.names)
    for key in keys:
        if key not in names:
            shown = ", ".join(repr(n) for n in names[:8])
            raise SeqtrainError(
                f"{path}: no column {key!r} (the table has {shown or 'no columns'}; choose with --source-key / "
                "--target-key)"
            )
        kind = schema.field(key).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise SeqtrainError(f"{path}: column {key!r} holds {kind}, expected strings")


def _batches(fmt: str, path: str, keys: list[str], pa: Any) -> Iterator[Any]:
    """The record batches of the `keys` columns, in row order."""
    if fmt == "parquet":
        try:
            pf = pa.parquet.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise SeqtrainError(f"{path}: not a readable parquet file ({e})") from None
        _columns(path, pf.schema_arrow, keys, pa)
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=keys):
            yield batch
        return
    for arrow in _arrow_files(path):
        try:
            source = pa.memory_map(arrow)
            try:  # datasets writes the IPC stream format; the file format is read as well
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                reader = (reader.get_batch(i) for i in range(reader.num_record_batches))
                schema = None
            else:
                schema = reader.schema
        except (OSError, pa.ArrowException) as e:
            raise SeqtrainError(f"{arrow}: not a readable Arrow file ({e})") from None
        first = True
        for batch in reader:
            if first:
                _columns(arrow, schema or batch.schema, keys, pa)
                first = False
            yield batch.select(keys)


def _texts(path: str, rows_before: int, key: str, column: Any, pa: Any) -> list[str | None]:
    """A string column's values; invalid UTF-8 in one (a string column need not hold valid UTF-8: a lone
    surrogate's bytes, written by another tool) is the line and jsonl readers' one-line error, naming the row
    and key, where pyarrow's conversion raised a UnicodeDecodeError naming neither."""
    try:
        return column.to_pylist()
    except (UnicodeDecodeError, pa.ArrowException):
        raw = column.view(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
        for i, value in enumerate(raw.to_pylist()):
            if value is None:
                continue
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SeqtrainError(
                    f"{path}:{rows_before + i + 1}: {key!r} holds invalid UTF-8 (byte 0x{value[e.start]:02x} at "
                    f"byte {e.start + 1} of the value), which is no text"
                ) from None
        raise


def extract(fmt: str, path: str, lang_keys: dict[str, str], out_paths: dict[str, str]) -> int:
    """Write each lang's column values, one per line, to out_paths[lang]; returns the number of rows. Errors
    name PATH:ROW (PATH.parquet or the folder; rows counted from 1 over the whole split)."""
    pa = _pyarrow("--parquet" if fmt == "parquet" else "--load-from-disk")
    keys = list(dict.fromkeys(lang_keys.values()))
    outs = {lang: open(out_paths[lang], "w", encoding="utf-8", newline="\n") for lang in lang_keys}
    n = 0
    try:
        for batch in _batches(fmt, path, keys, pa):
            columns = {key: _texts(path, n, key, batch.column(key), pa) for key in keys}
            for i in range(batch.num_rows):
                row = {key: columns[key][i] for key in keys}
                n += 1
                for lang, key in lang_keys.items():
                    # errors name the split's file or folder and the row in it, as the binarizer's do
                    if row[key] is None:
                        raise SeqtrainError(f"{path}:{n}: {key!r} is null (every example needs text)")
                    outs[lang].write(_value(path, n, row, key) + "\n")
    finally:
        for out in outs.values():
            out.close()
    if n == 0:
        raise SeqtrainError(f"{path}: no rows")
    return n
