"""`gemma-batch run`: a prompt dataset in, a completion dataset out, resumable at any moment.

Order of work, so that file-level problems stop the job before anything is written:
open and check the dataset, load and check the model, plan the KV cache, take the output lock,
open the result store (fresh, resume, or already complete); then stream rows through the engine,
committing each finished row as it completes, and write the final file atomically.

Rows are admitted in input order, at most `LOOKAHEAD` rows past the oldest unfinished one, so
memory stays bounded however long the dataset and however uneven the completions.
"""

from __future__ import annotations

import datetime
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from ..backends.pipeline import PipelineBackend
from ..backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from ..data import writers
from ..data.readers import open_dataset
from ..data.row_files import csv_problem
from ..data.rows import InputRow
from ..data.schema import output_schema
from ..engine.engine import Engine, Request
from ..engine.kv_plan import plan_kv
from ..model.checkpoint import Checkpoint
from ..model.config import Gemma3Config
from ..model.quant_cache import cache_root, converted_nbytes_by_dtype, load_converted
from ..model.tokenizer import Tokenizer
from .final_file import count_error_rows
from .devices import job_backend
from .fingerprint import job_fingerprint, model_fingerprint
from .lock import OutputLock
from .progress import Progress
from . import incremental
from .incremental import EarlierRows, request_hash
from .row_requests import RowFailure, RowRequests, error_row, output_row
from .signals import JobStopped, StopOnSignal
from .spec import JobSpec, UsageError, parse_size
from .store import ResultStore

LOOKAHEAD = 4096  # rows admitted past the oldest unfinished row


class JobFailed(Exception):
    """The job cannot run or finish (exit code 1); nothing half-written is left as the output."""


def run_job(spec: JobSpec, log: TextIO | None = None, out: TextIO | None = None) -> dict:
    """Run a job to its final file; return its statistics. Raises JobFailed / UsageError, and
    JobStopped when SIGTERM or SIGINT came while it ran (from the start: a job still loading
    stops before its first step; signals.py)."""
    with StopOnSignal() as stop:
        return _run(spec, log or sys.stderr, out or sys.stdout, stop)


def _run(spec: JobSpec, log: TextIO, out: TextIO, stop: StopOnSignal) -> dict:
    dataset = open_dataset(spec.input, spec.prompt_column, spec.id_column, spec.keep_columns, spec.chat)
    try:
        schema = output_schema(dataset.keep_types)
    except ValueError as e:  # a kept column named like an output column
        raise UsageError(str(e)) from None
    if spec.output_format == "csv" and (problem := csv_problem(schema)):
        raise UsageError(f"--output {spec.output_path}: {problem}")
    check_writable(spec.output_path.parent)
    cfg = Gemma3Config.from_dir(spec.model)
    tokenizer = Tokenizer.from_dir(spec.model)
    checkpoint = Checkpoint.open(spec.model, cfg)  # every header checked before any data is read
    fmt = spec.weight_format
    try:
        backend, why = job_backend(spec, cfg, checkpoint.layout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except (VulkanUnavailable, DeviceMemoryError) as e:
        raise JobFailed(str(e)) from None
    print(f"backend: {backend.identity} ({why}); weights {fmt}", file=log)
    if isinstance(backend, PipelineBackend):
        shares = "; ".join(f"{d}: weights {w / 2**20:.1f} MiB of {free / 2**20:.1f} MiB free"
                           for d, (w, free) in backend.stage_memory().items())
        print(f"placement: {shares}; {backend.crossing_bytes(1)} bytes of activations cross between devices "
              "per token", file=log)

    max_model_len = spec.max_model_len or cfg.max_position_embeddings
    if max_model_len > cfg.max_position_embeddings:
        print(f"notice: --max-model-len {max_model_len} is beyond the model's context; "
              f"using {cfg.max_position_embeddings}", file=log)
        max_model_len = cfg.max_position_embeddings
    # The weights are not loaded yet (a complete job never loads them): plan in what they will leave.
    available = backend.available_memory()
    weight_bytes = backend.weight_bytes(converted_nbytes_by_dtype(checkpoint.layout, fmt))
    if weight_bytes >= available:
        raise JobFailed(f"the model's weights take {weight_bytes / 2**30:.2f} GiB on the {backend.name} backend "
                        f"but only {available / 2**30:.2f} GiB is free there; use --place auto (layers that do not fit "
                        "on the CPU), --backend cpu or a smaller model")
    free = available - weight_bytes
    budget = parse_size(spec.kv_memory, free)
    step_tokens = spec.max_step_tokens or max(spec.max_batch, backend.default_step_tokens)
    groups = cfg.kv_groups()
    plan = plan_kv(
        groups, {g.name: backend.kv_bytes_per_token(g.name) for g in groups}, budget,
        spec.block_size, max_model_len, spec.max_batch, step_tokens,
        {g.name: backend.max_kv_blocks(g.name, spec.block_size) for g in groups},
    )
    if plan.notice:
        print(f"notice: {plan.notice}", file=log)
    print(plan.describe(groups), file=log)

    fingerprint = job_fingerprint(
        spec, dataset.fingerprint, model_fingerprint(spec.model, checkpoint.files), backend.identity, plan.max_model_len
    )
    output = spec.output_path
    with OutputLock(output):
        store = ResultStore(
            output, schema, fingerprint, output_format=spec.output_format, force=spec.force, openai_model=spec.model.name
        )
        store.open()
        if store.state == "complete":
            print(f"{output} is already complete for this job; nothing to do (--force to run it again)", file=log)
            return {
                "rows_total": dataset.num_rows,
                "rows_done_this_run": 0,
                "rows_failed": count_error_rows(output, spec.output_format),
            }
        if store.state == "resume":
            print(f"resuming: {store.num_done} of {dataset.num_rows} rows already done", file=log)
        earlier = EarlierRows(store.earlier or _dated_earlier(spec, output, fingerprint, log))
        if earlier.total:
            print(f"incremental: {earlier.total} finished rows of an earlier input; those whose request is "
                  "unchanged are kept", file=log)
        load_started = time.perf_counter()
        try:
            weights = load_converted(checkpoint, fmt, cache_root())
            backend.load_weights(weights.tensors)
            engine = Engine(backend, plan, tokenizer, spec.max_batch, step_tokens,  # allocates the KV cache
                            prefix_cache=spec.prefix_cache)
        except DeviceMemoryError as e:
            store.abandon()
            raise JobFailed(str(e)) from None
        print(f"model: {spec.model} loaded in {time.perf_counter() - load_started:.1f} s", file=log)
        if (budget := engine.scheduler.step_token_budget) < step_tokens and spec.max_step_tokens:
            print(f"notice: steps of at most {budget} tokens, not --max-step-tokens {spec.max_step_tokens}: "
                  f"a longer step's buffers would not fit {backend.identity}", file=log)
        elif not spec.max_step_tokens:
            print(f"steps: up to {budget} tokens (the backend's choice; --max-step-tokens sets it)", file=log)
        for line in weights.note:
            print(f"  {line}", file=log)
        requests = RowRequests(tokenizer, frozenset(cfg.eos_token_ids), spec.sampling, plan.max_model_len,
                               spec.constraint, cfg.vocab_size, spec.choices, spec.score_only)
        progress = Progress(dataset.num_rows, store.num_done, log, settle=spec.max_batch)
        started, done_before = time.perf_counter(), store.num_done
        started_at = datetime.datetime.now(datetime.timezone.utc)
        try:
            done, failed = _stream(dataset.rows(), store, engine, requests, progress, spec.max_batch, stop, earlier)
        except OSError as e:
            raise _write_failed(e, store) from None
        wall = time.perf_counter() - started
        progress.close()
        if earlier.total:
            print(f"incremental: kept {earlier.kept} rows, ran {done - earlier.kept} new or changed, dropped "
                  f"{earlier.dropped} earlier rows that no row of this input asks for (deleted or changed)", file=log)
        if stop.signum is not None:
            raise JobStopped(stop.signum, done)
        try:
            store.finalize(dataset.num_rows)
        except OSError as e:
            raise _write_failed(e, store) from None
        stats = {
            "rows_failed": count_error_rows(output, spec.output_format),
            "started_at": started_at.isoformat(timespec="seconds"),
            "ended_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rows_per_s": (done - earlier.kept) / wall if wall > 0 else 0.0,
            **engine.stats.summary(wall),
            "rows_total": dataset.num_rows,
            "rows_done_this_run": done,
            "rows_resumed": done_before,
            "rows_kept": earlier.kept,
            "rows_failed_this_run": failed,
            "backend": backend.identity,
            "weights": str(fmt),
            "kv_dtype": backend.kv_dtype,
            "prefix_cache": spec.prefix_cache,
            "model": str(spec.model),
            "input": str(spec.input),
            "output": str(output),
        }
        stats_path = store.write_stats(stats)
    _summary(stats, output, stats_path, out)
    return stats


def _dated_earlier(spec: JobSpec, output: Path, fingerprint: dict, log: TextIO) -> list[pa.Table]:
    """For an output name with {date}: the rows of the latest earlier file of that name whose
    job differs from this one in its input alone (incremental.py), else none."""
    if spec.output is None or spec.output_format != "parquet":
        return []
    for path in incremental.dated_siblings(str(spec.output), output):
        if incremental.reusable(writers.read_parquet_fingerprint(path), fingerprint):
            print(f"incremental: earlier rows from {path}", file=log)
            return incremental.read_quietly(pq.read_table, path)
    return []


def _stream(
    rows: Iterator[InputRow], store: ResultStore, engine: Engine, requests: RowRequests, progress: Progress, max_batch: int,
    stop: StopOnSignal, earlier: EarlierRows,
) -> tuple[int, int]:
    """Feed rows to the engine and commit each finished row, until the rows end or a signal asks
    to stop (checked at each step boundary); a row whose request an earlier job finished is
    committed from `earlier` instead. Returns (rows committed, error rows)."""
    in_flight: dict[int, tuple[InputRow, Request]] = {}
    order: deque[int] = deque()  # indices admitted to the engine, in input order
    held: InputRow | None = None  # next row, waiting for the lookahead window to move
    caching = engine.kv.prefix_seed is not None  # (the progress line gives the hit rate only with the cache on)
    done = failed = 0
    exhausted = False
    while True:
        while not exhausted and engine.num_unfinished < 2 * max_batch:
            while order and order[0] not in in_flight:
                order.popleft()
            row = held if held is not None else next(rows, None)
            held = None
            if row is None:
                exhausted = True
                break
            if order and row.index - order[0] >= LOOKAHEAD:
                held = row
                break
            if store.is_done(row.index):
                continue
            kept = earlier.take(row, request_hash(row)) if earlier.total and row.error is None else None
            if kept is not None:
                store.commit(kept)
                progress.update(1, free=True)
                done += 1
                continue
            request = requests.request(row)
            if isinstance(request, RowFailure):
                store.commit(error_row(row, request))
                progress.update(1)
                done, failed = done + 1, failed + 1
                continue
            engine.add(request)
            in_flight[row.index] = (row, request)
            order.append(row.index)
        if not engine.num_unfinished or stop.signum is not None:
            return done, failed
        for completion in engine.step():
            row, request = in_flight.pop(completion.request_id)
            store.commit(output_row(row, request, completion, requests.score_only))
            progress.update(1, len(completion.token_ids),
                            prompt=(completion.num_prompt_tokens, completion.cached_prompt_tokens) if caching else (0, 0))
            done += 1


def _write_failed(e: OSError, store: ResultStore) -> JobFailed:
    """A write that failed mid-job (disk full, read-only, permissions): where, why, and that the
    finished rows are kept for a rerun."""
    store.close()
    return JobFailed(f"could not write {e.filename or store.output}: {e.strerror or e}; the {store.num_done} finished "
                     f"rows are kept in {store.partial_dir}, and the same command resumes from them once it can write")


def check_writable(folder: Path) -> None:
    """JobFailed, before the model loads, if the job cannot create files in the output's folder."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gemma-batch-check-"):
            pass
    except OSError as e:
        raise JobFailed(f"cannot write in the output folder {folder}: {e.strerror or e}; nothing was run") from None


def _summary(stats: dict, output, stats_path, out: TextIO) -> None:
    hits = f"{100 * stats['prefix_hit_rate']:.0f}% from the prefix cache" if stats["prefix_cache"] else "prefix cache off"
    print(
        f"wrote {output} ({stats['rows_total']} rows, {stats['rows_failed']} failed; "
        f"{stats['rows_done_this_run']} done this run"
        f"{', %d of them kept from an earlier input' % stats['rows_kept'] if stats.get('rows_kept') else ''})\n"
        f"  {stats['wall_seconds']:.1f} s, {stats['rows_per_s']:.2f} rows/s, {stats['generated_tokens_per_s']:.1f} "
        f"generated tok/s; prefill {stats['prefill_tokens_per_s']:.1f} tok/s over {stats['prefill_seconds']:.1f} s, "
        f"decode {stats['decode_tokens_per_s']:.1f} tok/s over {stats['decode_seconds']:.1f} s; "
        f"TTFT mean {1000 * stats['ttft_mean_s']:.0f} ms, mean batch {stats['mean_batch_size']:.1f}, "
        f"preemptions {stats['preemptions']}; prompt tokens {stats['prompt_tokens']}, {hits}, "
        f"{stats['prompt_tokens_computed']} computed\n"
        f"  statistics: {stats_path}",
        file=out,
    )


__all__ = ["JobFailed", "JobStopped", "UsageError", "run_job"]
