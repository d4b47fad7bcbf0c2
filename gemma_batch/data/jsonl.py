"""JSON Lines input (plain rows and OpenAI Batch requests), read line by line in binary mode.

One line is one row; blank (whitespace-only) lines are skipped and are not rows. A UTF-8 byte order
mark at the start of the file is ignored. Memory is bounded by the longest line. A file named
*.gz or *.zst is decompressed as it streams (`open_lines`, pyarrow's codecs); a cut-off or corrupt
stream is an OSError there, which the reader turns into a DatasetError naming the file.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from .openai_batch import OPENAI_KEYS, openai_row
from .row_checks import RowError, RowSpec, error_row, make_row, unknown_id
from .rows import DatasetError, InputRow
from .seen_ids import SeenIds

BOM = b"\xef\xbb\xbf"
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}  # file suffix -> pyarrow codec of a compressed JSONL input


def format_suffix(path: Path) -> str:
    """The suffix that names a file's format, under any compression suffix (in.csv.gz -> .csv), lower case."""
    name = path.name.lower()
    for compressed in COMPRESSIONS:
        name = name.removesuffix(compressed)
    return Path(name).suffix


def open_lines(path: Path) -> IO[bytes]:
    """The file's bytes for line reading, decompressed as they stream if its name says so."""
    codec = COMPRESSIONS.get(path.suffix.lower())
    if codec is None:
        return path.open("rb")
    return io.BufferedReader(pa.input_stream(str(path), compression=codec), buffer_size=1 << 20)
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def data_lines(f: IO[bytes], digest: Any = None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes) of each non-blank line; every line's bytes go to `digest`."""
    for lineno, line in enumerate(f, 1):
        if digest is not None:
            digest.update(line)
        if lineno == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        if line.strip():
            yield lineno, line


def parse_line(line: bytes) -> dict[str, Any]:
    """A line's JSON object; RowError if it is not UTF-8, not JSON, or not an object."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowError(f"not valid UTF-8 (byte 0x{line[e.start]:02x} at offset {e.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise RowError(f"not valid JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise RowError("not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise RowError(f"not a JSON object (got {_JSON_TYPES.get(type(value), 'null')})")
    if "\\u" in text:  # a \uXXXX escape can decode to half a surrogate pair: text no tokenizer takes
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise RowError(f"not valid Unicode: an unpaired surrogate \\u{ord(e.object[e.start]):04x} escape") from None
    return value


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return True


@dataclass(frozen=True)
class JsonlScan:
    """What one pass over a JSONL file found."""

    num_rows: int
    fingerprint: str  # hex blake2b-128 of the file's bytes
    openai: bool  # the first row is an OpenAI Batch request
    first_keys: tuple[str, ...] | None  # the keys of the first row that is a JSON object (None: no such row)
    unsettled: tuple[tuple[str, ...], ...]  # the groups of names the scan looked for and found in no line

    @property
    def has_id(self) -> bool:  # the first row that is a JSON object has an "id" key
        return "id" in (self.first_keys or ())


def scan_jsonl(path: Path, wanted: Sequence[tuple[str, ...]] = ()) -> JsonlScan:
    """Count rows, hash the file, detect the flavour, and look for the names of each group in
    `wanted` (alternatives: the search for a group ends at the first line holding one of them) as
    quoted strings (a byte search: a key, or a value; `absent_groups` settles the rest); DatasetError
    if the file has no rows or its last line is cut off (no trailing newline and not valid JSON)."""
    digest = blake2b(digest_size=16)
    num_rows, openai, first_keys = 0, False, None
    pending = {group: [form for name in group for form in _quoted(name)] for group in wanted}
    last_lineno, last_line = 0, b""
    with open_lines(path) as f:
        for last_lineno, last_line in data_lines(f, digest):
            num_rows += 1
            if pending:  # (a typical file: settled on its first line)
                pending = {group: forms for group, forms in pending.items() if not any(f in last_line for f in forms)}
            if first_keys is None:
                try:
                    record = parse_line(last_line)
                except RowError:
                    continue
                first_keys = tuple(record)
                openai = num_rows == 1 and OPENAI_KEYS <= record.keys()
    if num_rows == 0:
        raise DatasetError(f"{path} has no rows (only blank lines)")
    if not last_line.endswith(b"\n") and not _is_json(last_line):
        raise DatasetError(f"{path} ends in the middle of a row (line {last_lineno}): truncated?")
    return JsonlScan(num_rows, digest.hexdigest(), openai, first_keys, tuple(pending))


def _quoted(name: str) -> tuple[bytes, ...]:
    """`name` as a JSON string in a line's bytes: as written with or without \\u escapes."""
    return tuple({json.dumps(name).encode(), json.dumps(name, ensure_ascii=False).encode("utf-8", "surrogatepass")})


def absent_groups(path: Path, groups: Sequence[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """Of `groups` (ones the scan's byte search did not settle), those no name of which is a key
    of any row, found by parsing the rows (so never a key the search missed, one written with
    escapes of plain letters, say)."""
    unsure = set(groups)
    if not unsure:
        return unsure
    with open_lines(path) as f:
        for _, line in data_lines(f):
            try:
                keys = parse_line(line).keys()
            except RowError:
                continue
            unsure = {group for group in unsure if keys.isdisjoint(group)}
            if not unsure:
                break
    return unsure


def jsonl_rows(path: Path, spec: RowSpec, openai: bool) -> Iterator[InputRow]:
    """Every row of a JSONL file in order, plain rows or (`openai`) OpenAI Batch requests."""
    seen = SeenIds()
    to_row = openai_row if openai else make_row
    with open_lines(path) as f:
        for index, (lineno, line) in enumerate(data_lines(f)):
            where = f"row {index} (line {lineno})"
            try:
                record = parse_line(line)
            except RowError as e:
                yield error_row(index, where, str(e), None if openai else unknown_id(index, spec), spec.keep({}))
                continue
            yield to_row(index, where, record, spec, seen)
