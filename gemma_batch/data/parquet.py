"""Parquet input, read in batches of 1024 rows and only the columns a job needs.

The prompt column (or `messages`), the id column, the sampling-override columns the file has
(named as in ROW_PARAMS) and the kept columns; values are the Python values of `to_pylist()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .row_checks import RowSpec, make_row, unknown_id
from .rows import CONSTRAINT_COLUMNS, ROW_PARAMS, ColumnNotFound, DatasetError, InputRow
from .seen_ids import SeenIds

BATCH_SIZE = 1024
_ARROW_ERRORS = (pa.ArrowException, OSError)


@dataclass(frozen=True)
class ParquetLayout:
    """What a Parquet file holds, as far as a job is concerned."""

    num_rows: int
    spec: RowSpec
    columns: list[str]  # the columns to read, each once
    keep_types: dict[str, pa.DataType]


def _missing(path: Path, what: str, names: Sequence[str]) -> ColumnNotFound:
    return ColumnNotFound(f"{path}: {what}; the file has columns: {', '.join(map(repr, names)) or '(none)'}")


def open_parquet(
    path: Path, prompt_column: str, id_column: str | None, keep_columns: Sequence[str], chat: bool | None
) -> ParquetLayout:
    """Read a Parquet file's footer and check that the columns a job needs are there."""
    with path.open("rb") as f:
        try:
            pf = pq.ParquetFile(f)
        except _ARROW_ERRORS as e:
            raise DatasetError(
                f"{path} cannot be read as Parquet: it looks truncated or is not Parquet ({e})"
            ) from None
        schema, num_rows = pf.schema_arrow, pf.metadata.num_rows
    names = schema.names
    if num_rows == 0:
        raise DatasetError(f"{path} has no rows")
    if prompt_column not in names and "messages" not in names:
        raise _missing(path, f"no prompt column {prompt_column!r} (--prompt-column, default 'prompt') and no "
                       "'messages' column", names)
    if id_column is not None and id_column not in names:
        raise _missing(path, f"--id-column {id_column!r} is not a column", names)
    absent = [name for name in keep_columns if name not in names]
    if absent:
        raise _missing(path, f"--keep-columns {', '.join(map(repr, absent))}: not column(s) of the file", names)
    if id_column is None and "id" in names:
        id_column = "id"
    wanted = [prompt_column, "messages", id_column, *ROW_PARAMS, *CONSTRAINT_COLUMNS, *keep_columns]
    columns = list(dict.fromkeys(name for name in wanted if name in names))
    spec = RowSpec(prompt_column, id_column, tuple(keep_columns), chat, keep_value=lambda v: v)
    return ParquetLayout(num_rows, spec, columns, {name: schema.field(name).type for name in keep_columns})


def parquet_rows(path: Path, layout: ParquetLayout) -> Iterator[InputRow]:
    """Every row of a Parquet file in order."""
    seen = SeenIds()
    index = 0
    with path.open("rb") as f:
        batches = pq.ParquetFile(f).iter_batches(batch_size=BATCH_SIZE, columns=layout.columns)
        while True:
            try:
                batch = next(batches, None)
            except _ARROW_ERRORS as e:
                raise DatasetError(f"{path}: cannot read rows from row {index} on: {e}") from None
            if batch is None:
                return
            names = batch.schema.names
            for values in zip(*(_values(path, name, column) for name, column in zip(names, batch.columns))):
                record = dict(zip(names, values))
                bad = next((name for name, v in record.items() if isinstance(v, _BadText)), None)
                if bad is None:
                    yield make_row(index, f"row {index}", record, layout.spec, seen)
                else:
                    cells = {k: record.get(k) for k in layout.spec.keep_columns}
                    keep = {k: v.lossy if isinstance(v, _BadText) else v for k, v in cells.items()}
                    error = f"row {index}: column {bad!r} is {record[bad].reason}"
                    yield InputRow(index, unknown_id(index, layout.spec), keep=keep, error=error)
                index += 1


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
