"""Rows of Arrow record batches, the shared part of the Parquet and CSV readers.

A batch's cells become Python values (`to_pylist()`); a string cell whose bytes are not UTF-8
makes its row an error row, naming the column, instead of failing the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from .row_checks import RowSpec, make_row, unknown_id
from .rows import CONSTRAINT_COLUMNS, ROW_PARAMS, ColumnNotFound, DatasetError, InputRow
from .seen_ids import SeenIds

Record = dict[str, Any]


def check_columns(path: Path, names: Sequence[str], prompt_column: str, id_column: str | None,
                  keep_columns: Sequence[str]) -> str | None:
    """The id column (`id_column`, else "id" when the file has it, else None); ColumnNotFound,
    naming the flag and the file's columns, where a column the job's flags name is missing."""
    def missing(what: str) -> ColumnNotFound:
        return ColumnNotFound(f"{path}: {what}; the file has columns: {', '.join(map(repr, names)) or '(none)'}")

    if prompt_column not in names and "messages" not in names:
        raise missing(f"no prompt column {prompt_column!r} (--prompt-column, default 'prompt') and no 'messages' column")
    if id_column is not None and id_column not in names:
        raise missing(f"--id-column {id_column!r} is not a column")
    absent = [name for name in keep_columns if name not in names]
    if absent:
        raise missing(f"--keep-columns {', '.join(map(repr, absent))}: not column(s) of the file")
    return id_column if id_column is not None or "id" not in names else "id"


def wanted_columns(names: Sequence[str], prompt_column: str, id_column: str | None, keep_columns: Sequence[str]) -> list[str]:
    """The columns a job reads, each once: prompt or messages, id, per-row parameters and
    constraints, kept columns."""
    wanted = [prompt_column, "messages", id_column, *ROW_PARAMS, *CONSTRAINT_COLUMNS, *keep_columns]
    return list(dict.fromkeys(name for name in wanted if name in names))


def batch_rows(
    path: Path, batch: pa.RecordBatch, indices: Iterator[int], spec: RowSpec, seen: SeenIds,
    convert: Callable[[Record], Record] = lambda record: record,
) -> Iterator[InputRow]:
    """The rows of `batch`, numbered by `indices` (one number a row, taken as they go);
    `convert` turns each record's cells into the values `make_row` checks (the CSV reader parses
    numbers and JSON text there)."""
    names = batch.schema.names
    columns = [_values(path, name, column) for name, column in zip(names, batch.columns)]
    for index, values in zip(indices, zip(*columns)):
        record = dict(zip(names, values))
        bad = next((name for name, v in record.items() if isinstance(v, _BadText)), None)
        if bad is None:
            yield make_row(index, f"row {index}", convert(record), spec, seen)
        else:
            yield InputRow(index, unknown_id(index, spec), keep=_lossy_keep(record, spec),
                           error=f"row {index}: column {bad!r} is {record[bad].reason}")


def _lossy_keep(record: Mapping[str, Any], spec: RowSpec) -> Record:
    cells = {k: record.get(k) for k in spec.keep_columns}
    return {k: v.lossy if isinstance(v, _BadText) else v for k, v in cells.items()}


class _BadText:
    """A string cell whose bytes are not UTF-8: its row becomes an error row."""

    def __init__(self, raw: bytes, error: UnicodeDecodeError) -> None:
        self.lossy = raw.decode("utf-8", errors="replace")  # for kept columns
        self.reason = f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})"


def _values(path: Path, name: str, column: pa.Array) -> list:
    """The column's Python values; cells of a string column that are not UTF-8 become _BadText."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise DatasetError(f"{path}: column {name!r} holds text that is not valid UTF-8") from None
    raw = column.view(pa.binary() if pa.types.is_string(column.type) else pa.large_binary()).to_pylist()
    return [None if b is None else _text_or_bad(b) for b in raw]


def _text_or_bad(raw: bytes) -> str | _BadText:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _BadText(raw, e)
