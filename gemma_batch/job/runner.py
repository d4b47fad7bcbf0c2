"""`gemma-batch run`: a prompt dataset in, a completion dataset out, resumable at any moment.

Order of work, so that file-level problems stop the job before anything is written:
open and check the dataset (and, for up to row_bound.PRESCAN_ROWS rows, bound their lengths),
load and check the model, plan the KV cache, take the output lock, open the result store (fresh,
resume, or already complete); start making the rows' requests on a thread, load the weights
(and, for a small input, cut the KV cache to the rows' token counts: row_bound.CountedRows);
then stream rows through the engine, committing each finished row as it completes, and write
the final file atomically. The log's `start-up` line and the statistics' `startup_*` columns
say where the time before the first step went (gemma_batch/startup.py).

Rows are admitted in input order, at most `LOOKAHEAD` rows past the oldest unfinished one, so
memory stays bounded however long the dataset and however uneven the completions.
"""

from __future__ import annotations

import datetime
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator
from typing import TextIO

from ..data.rows import InputRow
from ..data.writers import set_up_arrow_meanwhile
from ..engine.engine import Engine, Request
from ..engine.request import NonFiniteLogits
from ..model.read_ahead import read_ahead
from ..startup import Phases, column, phase, phases_line, process_seconds, recording
from .fingerprint import job_fingerprint, model_fingerprint
from .incremental import EarlierRows
from .lifecycle import (complete_stats, finish, non_finite_failure, open_input, open_store, report_kept, run_record,
                        settle, settled_before, write_failed)
from .lock import OutputLock
from .model_setup import JobFailed, prepare_model
from .progress import Progress
from .row_bound import COUNTED_ROWS, PRESCAN_ROWS, CountedRows, row_bound
from .row_requests import RowFailure, error_row, output_row
from .signals import JobStopped, StopOnSignal
from .spec import JobSpec, UsageError
from .store import ResultStore

LOOKAHEAD = 4096  # rows admitted past the oldest unfinished row
assert COUNTED_ROWS <= LOOKAHEAD  # (rows to count all fit the read-ahead before the first is taken)


def run_job(spec: JobSpec, log: TextIO | None = None, out: TextIO | None = None) -> dict:
    """Run a job to its final file; return its statistics. Raises JobFailed / UsageError, and
    JobStopped when SIGTERM or SIGINT came while it ran (from the start: a job still loading
    stops before its first step; signals.py)."""
    begun = process_seconds()  # (the interpreter's start and the imports)
    with StopOnSignal() as stop, warnings.catch_warnings(), recording(Phases()) as phases:
        # numpy's overflow warnings say less than the engine's own check (NonFiniteLogits)
        warnings.filterwarnings("ignore", r"(overflow|invalid value) encountered", RuntimeWarning)
        return _run(spec, log or sys.stderr, out or sys.stdout, stop, phases, begun)


def _run(spec: JobSpec, log: TextIO, out: TextIO, stop: StopOnSignal, phases: Phases, begun: float | None) -> dict:
    """The job, its start-up timed into `phases` (recording), `begun` seconds after the process's start."""
    began = time.perf_counter()
    with phase("input"):
        dataset, schema = open_input(spec)
        rows = row_bound(dataset.rows(), spec.max_tokens, spec.choices) if dataset.num_rows <= PRESCAN_ROWS else None
    counted = CountedRows() if rows is not None and rows.countable(dataset.num_rows) else None
    model = prepare_model(spec, log, rows, recount=counted is not None)
    backend, plan = model.backend, model.plan
    fingerprint = job_fingerprint(spec, dataset.fingerprint, model_fingerprint(model.folder, model.checkpoint.files),
                                  backend.identity, plan.max_model_len, model.weights_label)
    with OutputLock(spec.output_path):
        with phase("output store"):
            store, earlier = open_store(spec, schema, fingerprint, dataset, log)
        if store.state == "complete":
            return complete_stats(spec, dataset)
        requests = model.requests()
        # The rows' requests (tokenizing) made on a thread from now on: while the weights load, then
        # while the device runs the steps.
        made = requests.requests(dataset.rows(), lambda row: settled_before(row, store, earlier))
        made = read_ahead(made if counted is None else counted.count(made), LOOKAHEAD)
        try:  # (made.close(): rows left when the job stops early, the thread stops)
            try:
                engine = model.load(log, counted)
            except JobFailed:
                store.abandon()
                raise
            startup = _startup(phases, begun, began, log)
            progress = Progress(dataset.num_rows, store.num_done, log, settle=spec.max_batch)
            set_up_arrow_meanwhile()  # (for the final file, while the steps run)
            started, done_before = time.perf_counter(), store.num_done
            started_at = datetime.datetime.now(datetime.timezone.utc)
            try:
                done, failed = _stream(made, store, engine, requests.score_only, progress, spec.max_batch, stop, earlier)
            except OSError as e:
                raise write_failed(e, store) from None
            except NonFiniteLogits as e:
                raise non_finite_failure(e, model.checkpoint, store, log) from None
        finally:
            made.close()
        wall = time.perf_counter() - started
        progress.close()
        report_kept(earlier, done, log)
        if stop.signum is not None:
            raise JobStopped(stop.signum, done)
        run = run_record(done, failed, done_before, earlier, started_at, wall)
        figures = {**engine.stats.summary(wall), "backend": backend.identity, "kv_dtype": backend.kv_dtype,
                   "weights": model.weights_label, **startup}
        return finish(spec, store, dataset, run, figures, out)


def _startup(phases: Phases, begun: float | None, began: float, log: TextIO) -> dict:
    """The start-up's line on `log` and its statistics: `startup_seconds` from the process's start
    (where the system says it; else from the job's) to the first step, and a `startup_<phase>_s`
    for each of its phases, the interpreter's start and the imports first (`startup_imports_s`);
    what no phase covers is the rest."""
    seconds = dict(phases.seconds)
    total = time.perf_counter() - began
    if begun is not None:
        seconds = {"imports": begun, **seconds}
        total += begun
    print(phases_line(seconds, total), file=log)
    return {"startup_seconds": total, **{f"startup_{column(name)}_s": s for name, s in seconds.items()}}


def _stream(
    rows: Iterator[tuple[InputRow, Request | RowFailure | None]], store: ResultStore, engine: Engine, score_only: bool,
    progress: Progress, max_batch: int, stop: StopOnSignal, earlier: EarlierRows,
) -> tuple[int, int]:
    """Feed rows (each with its request, or why it cannot run; None for one settled before the run,
    lifecycle.settled_before) to the engine and commit each finished row, until the rows end or a
    signal asks to stop (checked at each step boundary); a row whose request an earlier job
    finished is committed from `earlier` instead. Returns (rows committed, error rows)."""
    in_flight: dict[int, tuple[InputRow, Request]] = {}
    order: deque[int] = deque()  # indices admitted to the engine, in input order
    held: tuple[InputRow, Request | RowFailure | None] | None = None  # next row, waiting for the lookahead window to move
    caching = engine.kv.prefix_seed is not None  # (the progress line gives the hit rate only with the cache on)
    done = failed = 0
    exhausted = False
    while True:
        while not exhausted and engine.num_unfinished < 2 * max_batch:
            while order and order[0] not in in_flight:
                order.popleft()
            pair = held if held is not None else next(rows, None)
            held = None
            if pair is None:
                exhausted = True
                break
            row, request = pair
            if order and row.index - order[0] >= LOOKAHEAD:
                held = pair
                break
            settled = settle(row, store, earlier, progress)
            if settled is not None:
                done += settled == "kept"
                continue
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
            store.commit(output_row(row, request, completion, score_only))
            progress.update(1, len(completion.token_ids),
                            prompt=(completion.num_prompt_tokens, completion.cached_prompt_tokens) if caching else (0, 0))
            done += 1


__all__ = ["JobFailed", "JobStopped", "UsageError", "run_job"]
