"""Incremental jobs: a rerun over a changed input keeps the finished rows whose request did not
change, runs the rest, and drops the rows gone from the input.

A row's request is what its completion depends on besides the job's settings: its id (the
sampler's key), its prompt or messages and its per-row parameters (`request_hash`, stored in the
output's `request_hash` column). An earlier job's finished rows may be kept when its fingerprint
differs from this job's in the input alone (`reusable`): the same model, backend and settings
make the same completion for the same request, whatever the row's place or batch (the engine is
batch-invariant). Error rows are never kept (their reasons name their row numbers); they cost no
model time to make again. Kept rows take this input's row number and kept columns.

Where earlier rows come from (`EarlierRows`): the output this job replaces, a partial folder of
a run over an earlier input that was stopped (read before the folder is cleared), and for an
output name with `{date}` the latest earlier file of that name (`dated_siblings`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..data.rows import InputRow
from ..data.schema import BASE_FIELDS
from .codec import RowCodec
from .fingerprint import fingerprint_differences
from .journal import Journal
from .spec import DATE

_BASE = [f.name for f in BASE_FIELDS]


def request_hash(row: InputRow) -> str:
    """32 hex digits of blake2b over the row's id, kind, prompt or messages, per-row parameters and
    constraint (left out when it has none, so rows hash as before constraints existed)."""
    content = [row.id, row.kind, row.prompt, row.messages, sorted(row.params.items()), row.error]
    if row.constraint is not None:
        content.append([row.constraint.kind, row.constraint.spec])
    if row.choices is not None:
        content.append(["choices", list(row.choices)])
    data = json.dumps(content, sort_keys=True, ensure_ascii=False, default=repr).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def reusable(stored: Any, current: dict, renamed: bool = False) -> bool:
    """Whether finished rows of the job with fingerprint `stored` may be kept by the job `current`:
    the two differ at most in their input's content, and (`renamed`: the input was renamed or
    moved, or the earlier output is not replaced) in the input's name."""
    allowed = {"input", "input_file"} if renamed else {"input"}
    return isinstance(stored, dict) and set(fingerprint_differences(stored, current)) <= allowed


def dated_siblings(template: str, output: Path) -> list[Path]:
    """Files named by `template` (an output name with DATE) for other dates than `output`'s,
    latest first (ISO dates sort by name)."""
    folder, name = Path(template).parent, Path(template).name
    if DATE not in name:
        return []
    before, after = name.split(DATE, 1)
    dated = re.compile(re.escape(before) + r"\d{4}-\d{2}-\d{2}" + re.escape(after))
    found = [p for p in folder.glob(f"{before}*{after}") if dated.fullmatch(p.name) and p != output and p.is_file()]
    return sorted(found, reverse=True)


class EarlierRows:
    """Finished rows of earlier jobs, by (id, request_hash); each is kept at most once."""

    def __init__(self, tables: Iterable[pa.Table]) -> None:
        self._columns: list[dict[str, list]] = []
        self._where: dict[tuple[str, str], tuple[int, int]] = {}
        for table in tables:
            if "request_hash" not in table.column_names:  # written before incremental jobs
                continue
            columns = table.select([n for n in _BASE if n in table.column_names]).to_pydict()
            t = len(self._columns)
            self._columns.append(columns)
            for i, (id_, key, error) in enumerate(zip(columns["id"], columns["request_hash"], columns["error"])):
                if error is None:
                    self._where.setdefault((id_, key), (t, i))
        self.total = len(self._where)  # distinct earlier rows that could be kept
        self.kept = 0

    def holds(self, row: InputRow, key: str) -> bool:
        """Whether `take` would give `row` an earlier output row (taking nothing)."""
        return (row.id, key) in self._where

    def take(self, row: InputRow, key: str) -> dict[str, Any] | None:
        """The output row of `row` (with this input's row number and kept columns) if an earlier
        job finished the same request, else None."""
        where = self._where.pop((row.id, key), None)
        if where is None:
            return None
        t, i = where
        self.kept += 1
        earlier = dict.fromkeys(_BASE) | {name: values[i] for name, values in self._columns[t].items()}  # (columns added since: null)
        return {**earlier, "row": row.index, **row.keep, "_kind": row.kind}

    @property
    def dropped(self) -> int:
        """Earlier rows no row of this input kept (gone, or changed)."""
        return len(self._where)


def read_quietly(read: Callable[..., pa.Table | None], *args: Any) -> list[pa.Table]:
    """[read(*args)], or [] where it gives nothing or the source cannot be read (its rows run again)."""
    try:
        table = read(*args)
    except (OSError, ValueError, TypeError, pa.ArrowException):
        return []
    return [] if table is None else [table]


def read_partial(parts: list[Path], journal: Journal, codec: RowCodec) -> pa.Table | None:
    """The committed rows of a stopped job's partial folder: its parts, then its journal's rows
    (decoded with `codec`, this job's), or None if it holds none."""
    tables = [pq.read_table(path) for path in parts]
    lines = [line for _, line in journal.read()] if journal.path.exists() else []
    if lines:
        tables.append(codec.decode(lines))
    if not tables:
        return None
    names = [n for n in _BASE if all(n in t.column_names for t in tables)]  # (kept columns come from this input)
    return pa.concat_tables([t.select(names) for t in tables])
