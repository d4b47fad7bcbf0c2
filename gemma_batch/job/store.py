"""The crash-safe store of a job's finished rows.

Rows finish out of order and the job may be killed (SIGKILL) at any instant; a rerun skips every
committed row and ends with the same final file as an uninterrupted run. On disk, beside the
output, "<output>.partial/" holds:

- job.json: {"fingerprint": ..., "output_format": ...} of the job that owns the folder. The
  folder is built under a temporary name and renamed into place, so it never lacks job.json.
- part-<start>-<end>.parquet (12-digit, zero-padded): rows [start, end) in order. Parts tile
  [0, frontier) with no gap; names sort in row order and carry their range, so open() recovers
  the frontier from a directory listing. Each part is written atomically (tmp, fsync, rename).
- pending.jsonl: the journal (`journal.py`), rows committed but not yet in a part, in commit
  order, one JSON line each. A row survives SIGKILL as soon as commit returns.

Compaction: once >= `compact_every` rows form a contiguous run from the frontier (and at
finalize), they become the next part, then the journal is rewritten without them (tmp, fsync,
rename). If a kill lands between the two, the journal still holds rows below the new frontier:
they are ignored on load, so no row is ever counted twice. Memory holds only the journal lines of
rows beyond the frontier: with the runner's bounded window, a few thousand lines at most.

finalize() streams the parts into "<output>.tmp-<pid>" (fsync, rename, fsync dir), then removes
the partial folder (renamed away first, so it vanishes atomically). The final file records the
fingerprint, so that open() can tell a complete job (final_file.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from ..data import writers
from ..data.row_files import ROW_FORMATS
from . import final_file, incremental
from .codec import RowCodec
from .fingerprint import fingerprint_differences
from .journal import Journal

KIND_KEY = "_kind"  # extra row key (not a schema column) with the request kind, "chat" or "text"
_JOB = "job.json"
_JOURNAL = "pending.jsonl"
_PART = re.compile(r"part-(\d{12})-(\d{12})\.parquet")


class JobMismatch(Exception):
    """The output (or its partial folder) belongs to a job with a different fingerprint."""


class StoreCorrupt(Exception):
    """The partial folder is damaged in a way no crash can cause (e.g. a missing part)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


class ResultStore:
    """Finished rows of one job, kept in "<output>.partial/" beside the output until the final
    file is written. The caller holds the output's `OutputLock` from open() to finalize().

    For output_format "openai", each committed row also carries KIND_KEY ("chat" or "text"),
    which selects the response body; it is ignored for "parquet". `openai_model` is the "model"
    of the response bodies, and fingerprint["created"] (if present) their "created".
    The fingerprint must be JSON and must determine the output schema.
    """

    state: Literal["fresh", "resume", "complete"]

    def __init__(
        self,
        output: Path,
        schema: pa.Schema,
        fingerprint: dict,
        *,
        output_format: Literal["parquet", "openai", "jsonl", "csv", "parquet-dir"] = "parquet",
        force: bool = False,
        input_renamed: bool = False,
        openai_model: str = "gemma",
        compact_every: int = 4096,
    ) -> None:
        if output_format not in ("parquet", "openai", "parquet-dir", *ROW_FORMATS):
            raise ValueError(f"unknown output format {output_format!r}")
        self.output = Path(output)
        self.partial_dir = self.output.with_name(self.output.name + ".partial")
        self.stats_path = final_file.stats_path(self.output)
        self._schema = schema
        self._part_schema = schema
        if output_format == "openai":
            self._part_schema = schema.append(pa.field(KIND_KEY, pa.string(), nullable=False))
        self._codec = RowCodec(self._part_schema)
        self._fingerprint = json.loads(json.dumps(fingerprint))  # as read back from disk
        self._format = output_format
        self._force = force
        self._input_renamed = input_renamed
        self._openai_model = openai_model
        self._compact_every = compact_every
        self._frontier = 0  # rows [0, frontier) are in parts
        self._contig = 0  # first uncommitted row (rows [frontier, contig) are pending)
        self._pending: dict[int, bytes] = {}  # index -> journal line, for rows >= frontier
        self._parts: list[Path] = []
        self._journal = Journal(self.partial_dir / _JOURNAL)
        self.earlier: list[pa.Table] = []  # finished rows of earlier jobs this one may keep (open)

    @property
    def num_done(self) -> int:
        """Number of committed rows."""
        return self._frontier + len(self._pending)

    def is_done(self, index: int) -> bool:
        """Whether row `index` is committed."""
        return index < self._frontier or index in self._pending

    def open(self) -> None:
        """Inspect the disk and set `state`: "resume" (partial folder of this job: its rows are
        loaded), "complete" (final output of this job, no partial folder: nothing to do), or
        "fresh" (a new partial folder). A partial folder or output of another job raises
        JobMismatch, unless that job differs in its input's content alone (Parquet output; with
        `input_renamed`, in the input's name too): then its rows go to `earlier`
        (incremental.py), the folder is cleared, the output stays until finalize replaces it. With force, a partial folder of another job is wiped now, and any existing
        output (even this job's, to run it again) is replaced at finalize; this job's own
        partial folder is still resumed (it holds the rows a rerun would produce)."""
        for path in (self.output, self.partial_dir, final_file.sidecar(self.output), self.stats_path):
            writers.remove_stale_tmps(path)
        job = {"fingerprint": self._fingerprint, "output_format": self._format}
        if self.partial_dir.is_dir():
            stored = _read_json(self.partial_dir / _JOB)
            if stored == job:
                self._load()
                self.state = "resume"
                if self.output.exists() and self._keeps(final_file.read_fingerprint(self.output, self._format), self._format):
                    self.earlier += incremental.read_quietly(pq.read_table, self.output)
                return
            if not isinstance(stored, dict):
                stored = {}
            if self._keeps(stored.get("fingerprint"), stored.get("output_format")):
                parts = sorted(self.partial_dir.glob("part-*.parquet"))
                self.earlier += incremental.read_quietly(incremental.read_partial, parts, Journal(self.partial_dir / _JOURNAL),
                                                         self._codec)
            else:
                self._mismatch(self.partial_dir, stored.get("fingerprint"), stored.get("output_format"))
            writers.remove_tree(self.partial_dir)
        if self.output.exists():
            stored_fp = final_file.read_fingerprint(self.output, self._format)
            if stored_fp == self._fingerprint and not self._force:
                self.state = "complete"
                return
            if self._keeps(stored_fp, self._format):
                self.earlier += incremental.read_quietly(pq.read_table, self.output)
            else:
                self._mismatch(self.output, stored_fp, self._format)
        self._create(job)
        self.state = "fresh"

    def _keeps(self, fingerprint: Any, output_format: Any) -> bool:
        """Whether finished rows of the job (`fingerprint`, `output_format`) may be kept by this
        one (incremental.py: Parquet outputs of jobs that differ in their input alone)."""
        return (not self._force and output_format == self._format in ("parquet", "parquet-dir") and fingerprint != self._fingerprint
                and incremental.reusable(fingerprint, self._fingerprint, renamed=self._input_renamed))

    def _mismatch(self, where: Path, fingerprint: Any, output_format: Any) -> None:
        """Raise JobMismatch (unless force) for `where`, holding another job's files."""
        if self._force:
            return
        if not isinstance(fingerprint, dict):
            raise JobMismatch(f"{where} holds no readable job fingerprint (not written by this "
                              "job); rerun with --force to discard it and start over")
        keys = fingerprint_differences(fingerprint, self._fingerprint)
        if output_format != self._format:
            keys.append("output_format")
        if "input_file" in keys:
            raise JobMismatch(self._other_input(where, fingerprint.get("input_file"), [k for k in keys if k != "input_file"]))
        raise JobMismatch(f"{where} holds a different job (differing: {', '.join(keys)}); "
                          "rerun with --force to discard it and start over")

    def _other_input(self, where: Path, stored: Any, others: list[str]) -> str:
        """Why `where`, written from another input file, is not replaced, and what to do."""
        def shown(name: Any) -> str:
            return os.path.normpath(self.output.parent / name) if isinstance(name, str) else "?"

        was = (f"from {shown(stored)}" if isinstance(stored, str)
               else "by an earlier gemma-batch, which did not record its input file")
        also = f" (and differing: {', '.join(others)})" if [k for k in others if k != "input"] else ""
        return (f"{where} was written {was}, not from this job's input {shown(self._fingerprint['input_file'])}{also}: "
                "give --output to write elsewhere, --input-renamed if this input is that file renamed or moved (its "
                "rows whose request is unchanged are kept), or --force to replace it")

    def _create(self, job: dict) -> None:
        building = writers.tmp_path(self.partial_dir)
        building.mkdir()
        with writers.atomic_file(building / _JOB) as f:
            f.write(json.dumps(job).encode())
        os.replace(building, self.partial_dir)
        writers.fsync_dir(self.partial_dir.parent)
        self._journal.open()

    def _load(self) -> None:
        for stale in self.partial_dir.glob("*.tmp-*"):
            stale.unlink()
        for path in sorted(self.partial_dir.glob("part-*.parquet")):
            match = _PART.fullmatch(path.name)
            start, end = (int(g) for g in match.groups()) if match else (-1, -1)
            if start != self._frontier or end <= start:
                raise StoreCorrupt(f"{path}: does not continue the rows [0, {self._frontier}) "
                                   "of the earlier parts; rerun with --force to start over")
            self._parts.append(path)
            self._frontier = end
        for index, line in self._journal.read():
            if index >= self._frontier and index not in self._pending:
                self._pending[index] = line
        self._contig = self._frontier
        self._advance()
        self._journal.open()

    def _advance(self) -> None:
        while self._contig in self._pending:
            self._contig += 1

    def _require_open(self) -> None:
        if not self._journal.is_open:
            raise RuntimeError("the result store is not open for writing (call open() first)")

    def commit(self, row: Mapping[str, Any]) -> None:
        """Record one output row (keys: the schema's field names, plus KIND_KEY for "openai").
        Survives SIGKILL once this returns. ValueError if the row is already committed or does
        not fit the schema (TypeError for a value of the wrong type)."""
        self._require_open()
        index = row.get("row")
        if type(index) is not int or index < 0:
            raise ValueError(f"row index must be an int >= 0, got {index!r}")
        if self.is_done(index):
            raise ValueError(f"row {index} is already committed")
        if self._format == "openai":
            if row.get(KIND_KEY) not in ("chat", "text"):
                raise ValueError(f"row {index}: {KIND_KEY} must be 'chat' or 'text'")
        elif KIND_KEY in row:
            row = {k: v for k, v in row.items() if k != KIND_KEY}
        line = self._codec.encode(row)
        self._journal.append(line)
        self._pending[index] = line
        self._advance()
        if self._contig - self._frontier >= self._compact_every:
            self._compact()
        else:
            self._journal.sync_if_due()

    def _compact(self) -> None:
        """Move rows [frontier, contig) from the journal into a new part."""
        start, end = self._frontier, self._contig
        table = self._codec.decode([self._pending[i] for i in range(start, end)])
        part = self.partial_dir / f"part-{start:012d}-{end:012d}.parquet"
        writers.write_part(table, part)
        for i in range(start, end):
            del self._pending[i]
        self._frontier = end
        self._parts.append(part)
        self._journal.rewrite(self._pending[i] for i in sorted(self._pending))

    def finalize(self, num_rows: int) -> Path:
        """Write the final output (rows 0..num_rows-1 in input order, all committed, none beyond)
        atomically, remove the partial folder, and return the output path."""
        self._require_open()
        if self._contig < num_rows:
            raise ValueError(f"cannot finalize: row {self._contig} is not committed")
        if self.num_done > num_rows:
            raise ValueError(f"cannot finalize: rows beyond {num_rows - 1} are committed")
        if self._contig > self._frontier:
            self._compact()
        self.close()
        final_file.write_final(self.output, self._format, self._parts, self._schema, self._part_schema,
                               self._fingerprint, self._openai_model, KIND_KEY)
        writers.remove_tree(self.partial_dir)
        self.state = "complete"
        return self.output

    def abandon(self) -> None:
        """Close; remove the partial folder if this run created it and it holds no row."""
        self.close()
        if self.state == "fresh" and self.num_done == 0:
            writers.remove_tree(self.partial_dir)

    def close(self) -> None:
        """Close the journal without finalizing (committed rows stay on disk for a resume)."""
        self._journal.close()

    def write_stats(self, stats: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Path:
        """Write `stats` (one row, or a list of rows: writers.write_stats) as the Parquet file
        `stats_path(output)` beside the output, atomically; return its path."""
        writers.write_stats(self.stats_path, stats)
        return self.stats_path
