"""What every job does around its rows, local (runner.py) or on Ray (ray_data/job.py): check
the input and the output's folder before anything loads, open the result store (fresh, resumed,
complete, or keeping an earlier input's rows), and at the end write the final file and the
statistics and print the summary."""

from __future__ import annotations

import datetime
import tempfile
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from ..data import writers
from ..data.readers import Dataset, open_dataset
from ..data.rows import InputRow
from ..data.row_files import csv_problem
from ..data.schema import check_keep_names, output_schema
from ..engine.request import NonFiniteLogits
from ..model import verify
from ..model.checkpoint import Checkpoint
from . import incremental
from .final_file import count_error_rows
from .incremental import EarlierRows, request_hash
from .model_setup import JobFailed
from .progress import Progress
from .spec import JobSpec, UsageError
from .store import ResultStore


def open_input(spec: JobSpec) -> tuple[Dataset, pa.Schema]:
    """The job's dataset and output schema; UsageError for kept columns or a CSV output the
    schema does not allow, or an output folder the job cannot write in."""
    try:
        check_keep_names(spec.keep_columns)  # (before the file is read for them)
    except ValueError as e:  # a kept column named like an output column
        raise UsageError(str(e)) from None
    dataset = open_dataset(spec.input, spec.prompt_column, spec.id_column, spec.keep_columns, spec.chat)
    schema = output_schema(dataset.keep_types)
    if spec.output_format == "csv" and (problem := csv_problem(schema)):
        raise UsageError(f"--output {spec.output_path}: {problem}")
    check_writable(spec.output_path.parent)
    return dataset, schema


def check_writable(folder: Path) -> None:
    """UsageError, before the model loads, if the job cannot create files in the output's folder."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gemma-batch-check-"):
            pass
    except OSError as e:
        raise UsageError(f"cannot write in the output folder {folder}: {e.strerror or e}; nothing was run") from None


def open_store(spec: JobSpec, schema: pa.Schema, fingerprint: dict, dataset: Dataset, log: TextIO
               ) -> tuple[ResultStore, EarlierRows]:
    """The job's result store, opened (the caller holds the output's lock), and the earlier
    rows it may keep; says on `log` what it found."""
    output = spec.output_path
    store = ResultStore(output, schema, fingerprint, output_format=spec.output_format, force=spec.force,
                        input_renamed=spec.input_renamed,
                        openai_model=spec.model.name)
    store.open()
    if store.state == "complete":
        print(f"{output} is already complete for this job; nothing to do (--force to run it again)", file=log)
        return store, EarlierRows([])
    if store.state == "resume":
        print(f"resuming: {store.num_done} of {dataset.num_rows} rows already done", file=log)
    earlier = EarlierRows(store.earlier or _dated_earlier(spec, output, fingerprint, log))
    if earlier.total:
        print(f"incremental: {earlier.total} finished rows of an earlier input; those whose request is "
              "unchanged are kept", file=log)
    return store, earlier


def complete_stats(spec: JobSpec, dataset: Dataset) -> dict[str, Any]:
    """The statistics of a job found complete: nothing ran."""
    return {"rows_total": dataset.num_rows, "rows_computed": 0,
            "rows_failed": count_error_rows(spec.output_path, spec.output_format)}


def _dated_earlier(spec: JobSpec, output: Path, fingerprint: dict, log: TextIO) -> list[pa.Table]:
    """For an output name with {date}: the rows of the latest earlier file of that name whose
    job differs from this one in its input alone, content or name (incremental.py; that file
    stays), else none."""
    if spec.output is None or spec.output_format != "parquet":
        return []
    for path in incremental.dated_siblings(str(spec.output), output):
        if incremental.reusable(writers.read_parquet_fingerprint(path), fingerprint, renamed=True):
            print(f"incremental: earlier rows from {path}", file=log)
            return incremental.read_quietly(pq.read_table, path)
    return []


def settled_before(row: InputRow, store: ResultStore, earlier: EarlierRows) -> bool:
    """Whether `settle` will find the row done or kept, so that it needs no request; safe to ask on
    another thread before `settle` reaches the row (rows done stay done; earlier rows are taken
    only by `settle`)."""
    return store.is_done(row.index) or bool(earlier.total and row.error is None and earlier.holds(row, request_hash(row)))


def settle(row: InputRow, store: ResultStore, earlier: EarlierRows, progress: Progress) -> str | None:
    """What a row needs before it runs: "done" (committed already), "kept" (an earlier job's
    output row for the same request, committed now and counted), or None: it must run."""
    if store.is_done(row.index):
        return "done"
    taken = earlier.take(row, request_hash(row)) if earlier.total and row.error is None else None
    if taken is None:
        return None
    store.commit(taken)
    progress.update(1, free=True)
    return "kept"


def report_kept(earlier: EarlierRows, done: int, log: TextIO) -> None:
    """What an incremental run kept, ran and dropped."""
    if earlier.total:
        print(f"incremental: kept {earlier.kept} rows, ran {done - earlier.kept} new or changed, dropped "
              f"{earlier.dropped} earlier rows that no row of this input asks for (deleted or changed)", file=log)


def run_record(done: int, failed: int, resumed: int, earlier: EarlierRows, started: datetime.datetime,
               wall: float) -> dict[str, Any]:
    """`finish`'s `run` from a run's counts: `done` rows committed this run, `failed` of them
    error rows, `resumed` committed by earlier runs of this job; the rows it computed are the
    committed ones neither kept from an earlier input nor failed."""
    return {"rows_computed": done - earlier.kept - failed, "rows_failed_this_run": failed, "rows_kept": earlier.kept,
            "rows_dropped": earlier.dropped, "rows_resumed": resumed, "started": started,
            "wall": wall}


def finish(spec: JobSpec, store: ResultStore, dataset: Dataset, run: dict[str, Any], figures: dict[str, Any],
           out: TextIO, more: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Write the final file and the statistics (the job's row, then `more`: a Ray job's workers),
    print the summary; return the job's statistics. `run`: `run_record`'s; `figures`: the
    engine's (EngineStats.summary), the backend's and the weights' ("weights": what they are)."""
    try:
        store.finalize(dataset.num_rows)
    except OSError as e:
        raise write_failed(e, store) from None
    wall, output = run["wall"], spec.output_path
    stats = {
        "rows_failed": count_error_rows(output, spec.output_format),
        "started_at": run["started"].isoformat(timespec="seconds"),
        "ended_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows_per_s": (run["rows_computed"] + run["rows_failed_this_run"]) / wall if wall > 0 else 0.0,
        **figures,
        "rows_total": dataset.num_rows,
        **{k: v for k, v in run.items() if k not in ("started", "wall")},
        "prefix_cache": spec.prefix_cache,
        "model": str(spec.model),
        "input": str(spec.input),
        "output": str(output),
    }
    stats_path = store.write_stats([stats, *more])
    _summary(stats, output, stats_path, out)
    return stats


def write_failed(e: OSError, store: ResultStore) -> JobFailed:
    """A write that failed mid-job (disk full, read-only, permissions): where, why, and that the
    finished rows are kept for a rerun."""
    store.close()
    return JobFailed(f"could not write {e.filename or store.output}: {e.strerror or e}; the {store.num_done} finished "
                     f"rows are kept in {store.partial_dir}, and the same command resumes from them once it can write")


def non_finite_failure(e: NonFiniteLogits, checkpoint: Checkpoint, store: ResultStore, log: TextIO) -> JobFailed:
    """The job's failure when the model computed NaN or infinite logits: which rows, and what a
    scan of the checkpoint (model/verify.py) found. No row was written from those logits; the
    rows finished before stay in the partial folder (a folder this run made and left empty goes)."""
    store.abandon()
    rows = ", ".join(map(str, e.request_ids[:8])) + (", ..." if len(e.request_ids) > 8 else "")
    print("the model computed non-finite logits; scanning the checkpoint for NaN, infinite and out-of-range values",
          file=log)
    problems = list(verify.scan(checkpoint))
    kept = (f"; the {store.num_done} rows finished before are kept in {store.partial_dir} (computed from the same "
            "weights: give --force to compute them again)") if store.num_done else ""
    if problems:
        shown = "; ".join(p.describe() for p in problems[:4]) + ("; ..." if len(problems) > 4 else "")
        return JobFailed(f"the model computed NaN or infinite logits (row(s) {rows}), and its checkpoint is damaged: "
                         f"{shown}. Replace the file and run again{kept}")
    return JobFailed(f"the model computed NaN or infinite logits (row(s) {rows}), though no tensor of its checkpoint "
                     f"holds NaN, infinite or out-of-range values: its arithmetic overflowed on this backend (--backend "
                     f"cpu computes in float32){kept}")


def _summary(stats: dict, output: Path, stats_path: Path, out: TextIO) -> None:
    hits = f"{100 * stats['prefix_hit_rate']:.0f}% from the prefix cache" if stats["prefix_cache"] else "prefix cache off"
    counts = [f"{stats['rows_computed']} computed"]
    counts += [f"{stats['rows_failed_this_run']} failed"] if stats["rows_failed_this_run"] else []
    counts += [f"{stats['rows_kept']} kept from an earlier input"] if stats["rows_kept"] else []
    counts += [f"{stats['rows_dropped']} earlier rows dropped"] if stats["rows_dropped"] else []
    counts += [f"{stats['rows_resumed']} done by an earlier run"] if stats["rows_resumed"] else []
    print(
        f"wrote {output} ({stats['rows_total']} rows, {stats['rows_failed']} failed; this run: {', '.join(counts)})\n"
        f"  {stats['wall_seconds']:.1f} s, {stats['rows_per_s']:.2f} rows/s, {stats['generated_tokens_per_s']:.1f} "
        f"generated tok/s; prefill {stats['prefill_tokens_per_s']:.1f} tok/s over {stats['prefill_seconds']:.1f} s, "
        f"decode {stats['decode_tokens_per_s']:.1f} tok/s over {stats['decode_seconds']:.1f} s; "
        f"TTFT mean {1000 * stats['ttft_mean_s']:.0f} ms, mean batch {stats['mean_batch_size']:.1f}, "
        f"preemptions {stats['preemptions']}; prompt tokens {stats['prompt_tokens']}, {hits}, "
        f"{stats['prompt_tokens_computed']} computed\n"
        f"  statistics: {stats_path}",
        file=out,
    )
