"""CSV and TSV input (also .gz / .zst compressed), streamed with pyarrow's CSV reader.

The first line is the header; a field may be quoted, to hold the delimiter, line breaks or a
doubled quote character. Every cell is read as text, so a prompt `123` or an id `007` stays as
written: an empty cell is null, a quoted empty cell `""` an empty string. The per-row columns parse their text: `max_tokens`,
`temperature`, ... numbers (`42`, `0.7`); `messages` and `choices` JSON text; `stop` one stop
string, or a JSON array of them; `json_schema` JSON text, as in JSON Lines.

A record with more or fewer fields than the header is an error row: pyarrow's reader skips it
(`invalid_row_handler`) and the scan at open notes its place, so that every row keeps its number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv

from .arrow_rows import Record, batch_rows, check_columns, wanted_columns
from .jsonl import COMPRESSIONS, format_suffix
from .row_checks import RowSpec, keep_text, unknown_id
from .rows import ROW_PARAMS, DatasetError, InputRow
from .seen_ids import SeenIds

DELIMITERS = {".csv": ",", ".tsv": "\t"}  # file suffix (under any compression suffix) -> field delimiter
BLOCK_BYTES = 1 << 20  # bytes pyarrow parses at a time
_NUMBERS = tuple(name for name in ROW_PARAMS if name != "stop")
_JSON_CELLS = ("messages", "choices")
_FIRST_RECORD = 2  # pyarrow numbers records from 1, the header included


def delimiter(path: Path) -> str | None:
    """The field delimiter a file's name says (in.csv, in.tsv.gz), or None: not CSV."""
    return DELIMITERS.get(format_suffix(path))


@dataclass(frozen=True)
class CsvLayout:
    """What a CSV file holds, as far as a job is concerned."""

    num_rows: int  # records after the header, the ones with the wrong field count included
    spec: RowSpec
    columns: list[str]  # the columns to read, each once
    delimiter: str
    bad_records: dict[int, str]  # row index -> why pyarrow could not read it


def open_csv(path: Path, prompt_column: str, id_column: str | None, keep_columns: Sequence[str],
             chat: bool | None) -> CsvLayout:
    """Read the header, check that the columns a job needs are there, and count the records
    (reading the file once). DatasetError for a file without rows or with repeated header names."""
    sep = delimiter(path) or ","
    with _reader(path, sep, None, {}) as reader:
        names = reader.schema.names
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DatasetError(f"{path}: the header names {', '.join(map(repr, repeated))} more than once")
    id_column = check_columns(path, names, prompt_column, id_column, keep_columns)
    bad: dict[int, str] = {}
    with _reader(path, sep, names[:1], bad) as reader:
        num_rows = sum(batch.num_rows for batch in _batches(path, reader)) + len(bad)
    if num_rows == 0:
        raise DatasetError(f"{path} has no rows (only a header)")
    spec = RowSpec(prompt_column, id_column, tuple(keep_columns), chat, keep_value=keep_text)
    return CsvLayout(num_rows, spec, wanted_columns(names, prompt_column, id_column, keep_columns), sep, bad)


def csv_rows(path: Path, layout: CsvLayout) -> Iterator[InputRow]:
    """Every row of a CSV file in order, the records pyarrow skipped as error rows in their place."""
    seen, spec, bad = SeenIds(), layout.spec, layout.bad_records
    read = (index for index in range(layout.num_rows) if index not in bad)  # the rows pyarrow gives
    next_index = 0
    with _reader(path, layout.delimiter, layout.columns, {}) as reader:
        for batch in _batches(path, reader):
            for row in batch_rows(path, batch, read, spec, seen, _parse_cells):
                yield from _skipped(range(next_index, row.index), bad, spec)
                yield row
                next_index = row.index + 1
    yield from _skipped(range(next_index, layout.num_rows), bad, spec)


def _skipped(indices: range, bad: dict[int, str], spec: RowSpec) -> Iterator[InputRow]:
    for index in indices:
        yield InputRow(index, unknown_id(index, spec), keep=spec.keep({}), error=f"row {index}: {bad[index]}")


def _parse_cells(record: Record) -> Record:
    """A record's text cells as the values the row checks take (module docstring); text that
    does not parse stays text, for the check to name."""
    out = dict(record)
    for name in _NUMBERS:
        if isinstance(out.get(name), str):
            out[name] = _number(out[name])
    for name in _JSON_CELLS:
        if isinstance(out.get(name), str):
            out[name] = _json(out[name])
    stop = out.get("stop")
    if isinstance(stop, str) and stop.lstrip().startswith("[") and isinstance(parsed := _json(stop), list):
        out["stop"] = parsed
    return out


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text.strip())
        except ValueError:
            pass
    return text


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@contextmanager
def _reader(path: Path, sep: str, columns: list[str] | None, bad: dict[int, str]) -> Iterator[pcsv.CSVStreamingReader]:
    """pyarrow's streaming reader over `columns` (None: all), every cell as text; records with the
    wrong field count are skipped and noted in `bad` (row index -> why)."""
    def skip(record: pcsv.InvalidRow) -> str:
        if record.number is None:  # (only with threads, which this reader does not use)
            raise DatasetError(f"{path}: a record has {record.actual_columns} fields, the header {record.expected_columns}")
        bad[record.number - _FIRST_RECORD] = (f"has {record.actual_columns} field(s) where the header has "
                                              f"{record.expected_columns}: {record.text[:60]!r}")
        return "skip"

    codec = COMPRESSIONS.get(path.suffix.lower())
    try:
        source = pa.input_stream(str(path), compression=codec) if codec else pa.OSFile(str(path))
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e}") from None
    types = None if columns is None else {name: pa.string() for name in columns}
    try:
        with source:
            yield pcsv.open_csv(
                source,
                read_options=pcsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
                parse_options=pcsv.ParseOptions(delimiter=sep, newlines_in_values=True, invalid_row_handler=skip),
                convert_options=pcsv.ConvertOptions(
                    column_types=types, include_columns=columns, check_utf8=False, strings_can_be_null=True,
                    null_values=[""], quoted_strings_can_be_null=False,
                ),
            )
    except pa.ArrowInvalid as e:
        raise DatasetError(f"{path} cannot be read as {'TSV' if sep == chr(9) else 'CSV'}: {e}") from None


def _batches(path: Path, reader: pcsv.CSVStreamingReader) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as e:
            raise DatasetError(f"{path} cannot be read as CSV: {e}") from None
        yield batch
