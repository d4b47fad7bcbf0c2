"""A job's final file in its format, and the fingerprint it records, by which a rerun knows the job
is complete (store.py). Parquet keeps the fingerprint in its schema metadata (key b"gemma_batch");
OpenAI, JSON Lines and CSV output (data/row_files.py) in the sidecar "<output>.job.json", written
before the output is renamed into place (while the partial folder, which the store checks first,
still exists). A folder of Parquet parts ("parquet-dir", `--output-dir`) holds the store's parts,
named in row order, and its fingerprint in "_job.json" (a name Parquet readers pass over). The
job's statistics lie beside the output too (`stats_path`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..data import writers
from ..data.row_files import write_final_rows


FOLDER_JOB = "_job.json"  # a "parquet-dir" output's fingerprint


def sidecar(output: Path) -> Path:
    """Where a non-Parquet output's fingerprint goes."""
    return output.with_name(output.name + ".job.json")


def read_fingerprint(output: Path, output_format: str) -> Any:
    """The fingerprint the finished `output` records, or None where it records none (readable)."""
    if output_format == "parquet":
        return writers.read_parquet_fingerprint(output)
    try:
        return json.loads((output / FOLDER_JOB if output_format == "parquet-dir" else sidecar(output)).read_bytes())
    except (OSError, ValueError):
        return None


def write_final(output: Path, output_format: str, parts: Sequence[Path], schema: pa.Schema,
                part_schema: pa.Schema, fingerprint: dict, openai_model: str, kind_column: str) -> None:
    """Write the rows of `parts` (in order) to `output` in `output_format`, atomically, recording
    `fingerprint`. OpenAI lines take each row's request kind from `kind_column` of `part_schema`."""
    if output_format == "parquet":
        with writers.atomic_file(output) as f:
            writers.write_final_parquet(f, parts, schema, fingerprint)
        return
    if output_format == "parquet-dir":
        _write_folder(output, parts, fingerprint)
        return
    with writers.atomic_file(sidecar(output)) as f:
        f.write(json.dumps(fingerprint).encode())
    with writers.atomic_file(output) as f:
        if output_format == "openai":
            writers.write_final_openai(f, parts, part_schema, fingerprint, model=openai_model, kind_column=kind_column)
        else:
            write_final_rows(f, parts, schema, output_format)


def _write_folder(output: Path, parts: Sequence[Path], fingerprint: dict) -> None:
    """The parts, linked (not copied) into a new folder with the fingerprint, renamed to `output`
    in place of any earlier one (a kill in between leaves the partial folder: a rerun finishes)."""
    building = Path(f"{writers.tmp_path(output)}-new")  # (a stale one is cleared as a tmp; not remove_tree's name)
    building.mkdir()
    for part in parts:
        os.link(part, building / part.name)
    with writers.atomic_file(building / FOLDER_JOB) as f:
        f.write(json.dumps(fingerprint).encode())
    writers.fsync_dir(building)
    if output.is_dir():
        writers.remove_tree(output)
    os.replace(building, output)
    writers.fsync_dir(output.parent)


def count_error_rows(output: Path, output_format: str) -> int:
    """Error rows in a finished output file (this run's and any earlier run's)."""
    if output_format in ("parquet", "parquet-dir"):
        errors = pq.read_table(output, columns=["error"]).column("error")
    elif output_format == "csv":
        options = pacsv.ConvertOptions(include_columns=["error"], column_types={"error": pa.string()},
                                       strings_can_be_null=True)
        errors = pacsv.read_csv(output, convert_options=options).column("error")
    else:  # JSON lines: ours, or OpenAI's
        with output.open("rb") as f:
            return sum(1 for line in f if json.loads(line).get("error") is not None)
    return len(errors) - errors.null_count


def stats_path(output: Path) -> Path:
    """Where the job writing `output` puts its statistics, a file of its own for every output:
    out.parquet -> out.stats.parquet (a folder of parts: out -> out.stats.parquet), out.jsonl ->
    out.jsonl.stats.parquet, out.csv -> out.csv.stats.parquet."""
    if output.suffix.lower() in (".parquet", ""):
        return output.with_suffix(".stats.parquet")
    return output.with_name(output.name + ".stats.parquet")
