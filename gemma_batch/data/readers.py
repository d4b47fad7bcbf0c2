"""Streaming dataset readers for `gemma-batch run`: JSON Lines, Parquet, CSV / TSV and OpenAI Batch files.

`open_dataset` reads the file once to hash it, count its rows and find file-level problems
(`DatasetError`); `Dataset.rows()` then streams the rows, as often as needed, in bounded memory.
Row-level problems do not raise: the row comes out with `InputRow.error` set (see rows.py).

Format: a file starting with the Parquet magic "PAR1", or named *.parquet, is Parquet (its own
compression, any codec pyarrow reads); *.csv and *.tsv are CSV (csv_input.py); *.jsonl, *.json and
*.ndjson are JSON Lines, and a JSONL file whose first row is an object with `custom_id`, `method`,
`url` and `body` is an OpenAI Batch input file ("openai"). Text formats may be compressed (*.gz,
*.zst: decompressed as they stream). Any other name is refused (`UnknownFormat`), as is a .json
file holding one JSON array: guessing would fail every row.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import pyarrow as pa

from .csv_input import csv_rows, delimiter, open_csv
from .jsonl import JsonlScan, absent_groups, format_suffix, jsonl_rows, open_lines, scan_jsonl
from .parquet import open_parquet, parquet_rows
from .row_checks import RowSpec, keep_text
from .rows import ColumnNotFound, DatasetError, InputRow, UnknownFormat

Format = Literal["jsonl", "parquet", "csv", "openai"]
PARQUET_MAGIC = b"PAR1"
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
INPUT_NAMES = ".jsonl, .json, .ndjson, .csv or .tsv (each also .gz or .zst), or .parquet"


class Dataset:
    """An opened input file. `rows()` yields every data row, in order, with index 0..num_rows-1.

    Attributes:
        path: the file.
        format: "jsonl", "parquet", "csv" (CSV or TSV) or "openai" (OpenAI Batch requests in JSON Lines).
        num_rows: the number of data rows (blank JSONL lines are not rows).
        fingerprint: hex blake2b-128 of the file's bytes, for resuming a job on the same input.
        keep_types: the Arrow type of each kept column, in the order given (Parquet: the file's
            type; JSON formats: string, non-string values being JSON text; CSV: string).
    """

    def __init__(
        self,
        path: Path,
        format: Format,
        num_rows: int,
        fingerprint: str,
        keep_types: dict[str, pa.DataType],
        read: Callable[[], Iterator[InputRow]],
        stamp: tuple[int, int],
    ) -> None:
        self.path = path
        self.format: Format = format
        self.num_rows = num_rows
        self.fingerprint = fingerprint
        self.keep_types = keep_types
        self._read = read
        self._stamp = stamp  # (size, mtime_ns) when opened

    def __repr__(self) -> str:
        return f"Dataset({str(self.path)!r}, format={self.format!r}, num_rows={self.num_rows})"

    def rows(self) -> Iterator[InputRow]:
        """Stream the rows from the start of the file (each call starts over).

        Raises DatasetError if the file changed since it was opened or can no longer be read.
        """
        try:
            if _stamp(self.path.stat()) != self._stamp:
                raise DatasetError(f"{self.path} changed since it was opened; open it again")
            yield from self._read()
        except OSError as e:
            raise _os_error(self.path, e) from None


def open_dataset(
    path: Path,
    prompt_column: str = "prompt",
    id_column: str | None = None,
    keep_columns: Sequence[str] = (),
    chat: bool | None = None,
) -> Dataset:
    """Open an input file for a batch job, reading it once.

    Args:
        path: a .jsonl/.json/.ndjson or .csv/.tsv (also .gz or .zst compressed), .parquet or OpenAI
            Batch (.jsonl) file.
        prompt_column: the column (JSON key) holding plain-text prompts; a row may instead have a
            `messages` column/key holding a chat conversation. Not used for OpenAI files.
        id_column: the column holding row ids. None: "id" if the file has it (Parquet: in the
            schema or CSV header; JSONL: in the first row that is a JSON object), else the row
            numbers. A name given must be a column of a Parquet or CSV file, a key of some JSONL
            row (a row lacking it is an error row).
            OpenAI files always use `custom_id`.
        keep_columns: columns copied to the output as they are (Parquet, CSV: must exist; JSON
            formats: a key of some row, null in rows without it).
        chat: None: plain prompts are text rows and `messages` rows are chat rows; True: plain
            prompts are also wrapped as one user turn (OpenAI /v1/completions requests are not);
            False: `messages` rows (and OpenAI chat requests) are error rows.
    Raises:
        DatasetError: the file is missing, a directory, unreadable, empty (no rows) or truncated;
            UnknownFormat (a DatasetError) for a name of no format above; ColumnNotFound (a
            DatasetError) where it lacks the prompt, id or kept columns (JSON Lines: no row has
            the key); the message names the file.
    """
    path = Path(path)
    keep = tuple(dict.fromkeys(keep_columns))
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise DatasetError(f"{path} is a directory, not a data file")
        if not stat.S_ISREG(info.st_mode):
            raise DatasetError(f"{path} is not a regular file (it is read twice, so pipes cannot work)")
        if info.st_size == 0:
            raise DatasetError(f"{path} is empty: it has no rows")
        with path.open("rb") as f:
            magic = f.read(len(PARQUET_MAGIC))
        if magic == PARQUET_MAGIC or path.suffix.lower() == ".parquet":
            layout = open_parquet(path, prompt_column, id_column, keep, chat)
            return Dataset(
                path, "parquet", layout.num_rows, _fingerprint(path), layout.keep_types,
                lambda: parquet_rows(path, layout), _stamp(info),
            )  # fmt: skip
        if delimiter(path) is not None:
            table = open_csv(path, prompt_column, id_column, keep, chat)
            return Dataset(
                path, "csv", table.num_rows, _fingerprint(path), {name: pa.string() for name in keep},
                lambda: csv_rows(path, table), _stamp(info),
            )  # fmt: skip
        _check_jsonl_name(path)
        wanted = [(prompt_column, "messages"), *((name,) for name in keep), *([(id_column,)] if id_column else [])]
        scan = scan_jsonl(path, wanted)
        _check_keys(path, scan, prompt_column, id_column, keep)
    except OSError as e:
        raise _os_error(path, e) from None
    if id_column is None and scan.has_id:
        id_column = "id"
    spec = RowSpec(prompt_column, id_column, keep, chat, keep_value=keep_text)
    return Dataset(
        path, "openai" if scan.openai else "jsonl", scan.num_rows, scan.fingerprint,
        {name: pa.string() for name in keep}, lambda: jsonl_rows(path, spec, scan.openai), _stamp(info),
    )  # fmt: skip


def _check_jsonl_name(path: Path) -> None:
    """UnknownFormat unless the name says JSON Lines, or a .json file holds one JSON array."""
    suffix = format_suffix(path)
    if suffix not in JSONL_SUFFIXES:
        raise UnknownFormat(f"{path}: cannot tell its format from its name ({suffix or 'no extension'}); "
                            f"gemma-batch reads {INPUT_NAMES}")
    if suffix != ".json":
        return
    with open_lines(path) as f:
        start = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"["):
        raise UnknownFormat(f"{path} holds a JSON array; gemma-batch reads JSON Lines: one JSON object a line "
                            "(python -c \"import json,sys; [print(json.dumps(r)) for r in json.load(sys.stdin)]\" "
                            "< in.json > in.jsonl)")


def _check_keys(path: Path, scan: JsonlScan, prompt_column: str, id_column: str | None, keep: Sequence[str]) -> None:
    """ColumnNotFound where a JSON Lines file has rows but a key the job's flags name is in none of
    them: the prompt key (with no `messages` either), an --id-column given, a kept column (OpenAI
    files: kept columns only). A key in some rows only is fine (the others: an error row for a
    prompt or id, null for a kept column)."""
    if scan.first_keys is None:  # no row is a JSON object: every row is an error row, as it says
        return
    prompt, ident = (prompt_column, "messages"), (id_column,)
    absent = absent_groups(path, [group for group in scan.unsettled if not scan.openai or group not in (prompt, ident)])
    has = f"; the first row has keys: {', '.join(map(repr, scan.first_keys)) or '(none)'}"
    if prompt in absent:
        raise ColumnNotFound(f"{path}: no row has a prompt key {prompt_column!r} (--prompt-column, default 'prompt') "
                             f"or 'messages'{has}")
    if ident in absent:
        raise ColumnNotFound(f"{path}: --id-column {id_column!r}: no row has such a key{has}")
    missing = [name for name in keep if (name,) in absent]
    if missing:
        raise ColumnNotFound(f"{path}: --keep-columns {', '.join(map(repr, missing))}: no row has such a key{has}")


def _stamp(info: os.stat_result) -> tuple[int, int]:
    return info.st_size, info.st_mtime_ns


def _fingerprint(path: Path) -> str:
    """Hex blake2b-128 of a file's bytes, read in chunks."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _os_error(path: Path, e: OSError) -> DatasetError:
    """An OS error as a DatasetError that says what is wrong with the file."""
    if isinstance(e, FileNotFoundError):
        return DatasetError(f"{path} does not exist")
    if isinstance(e, PermissionError):
        return DatasetError(f"{path} is not readable (permission denied)")
    return DatasetError(f"cannot read {path}: {e.strerror or e}")
