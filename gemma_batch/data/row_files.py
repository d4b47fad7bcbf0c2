"""A job's rows as JSON Lines or CSV (`--output x.jsonl`, `--output x.csv`), the same columns as
the Parquet output, streamed from the result store's parts in row order.

JSON Lines: one object per row; values as JSON, with dates and times in ISO 8601, decimals as
strings and bytes as base64. CSV: a header, then one line per row (pyarrow's writer, nulls as
empty fields); list, struct and map values are JSON text. Binary columns (only kept input
columns can be binary) do not fit CSV: `csv_problem` names them before the job starts.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

from .writers import read_part

ROW_FORMATS = ("jsonl", "csv")


def json_value(value: Any) -> Any:
    """A JSON-ready form of a value `to_pylist` gives that json cannot write."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    raise TypeError(f"no JSON form for {type(value).__name__}")


def csv_problem(schema: pa.Schema) -> str | None:
    """Why rows of `schema` cannot be CSV, or None."""
    binary = [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)
              or pa.types.is_fixed_size_binary(f.type)]
    return f"column(s) {', '.join(binary)} hold bytes, which CSV cannot; use .parquet or .jsonl" if binary else None


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t)


def _csv_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.string()) if _nested(f.type) else f for f in schema])


def _csv_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    columns = []
    for field, column in zip(batch.schema, batch.columns):
        if _nested(field.type):
            text = [None if v is None else json.dumps(v, ensure_ascii=False, default=json_value) for v in column.to_pylist()]
            column = pa.array(text, pa.string())
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def write_final_rows(f: BinaryIO, parts: Iterable[Path], schema: pa.Schema, fmt: str) -> None:
    """Write the rows of `parts` (in order, columns of `schema`) to `f` as `fmt` ("jsonl" or "csv")."""
    if fmt == "jsonl":
        for part in parts:
            for batch in read_part(part, schema):
                f.writelines((json.dumps(row, ensure_ascii=False, default=json_value) + "\n").encode()
                             for row in batch.to_pylist())
        return
    out_schema = _csv_schema(schema)
    writer = pacsv.CSVWriter(f, out_schema)
    for part in parts:
        for batch in read_part(part, schema):
            writer.write_batch(_csv_batch(batch, out_schema))
    writer.close()
