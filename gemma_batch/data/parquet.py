"""Parquet input, read in batches of 1024 rows and only the columns a job needs.

The prompt column (or `messages`), the id column, the sampling-override columns the file has
(named as in ROW_PARAMS) and the kept columns; values are the Python values of `to_pylist()`
(arrow_rows.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .arrow_rows import batch_rows, check_columns, wanted_columns
from .row_checks import RowSpec
from .rows import DatasetError, InputRow
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
    id_column = check_columns(path, names, prompt_column, id_column, keep_columns)
    columns = wanted_columns(names, prompt_column, id_column, keep_columns)
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
            yield from batch_rows(path, batch, iter(range(index, index + batch.num_rows)), layout.spec, seen)
            index += batch.num_rows
