"""`gemma-batch run --ray`: one job over a Ray cluster's workers, one output.

The driver (this process) does what a local job does around its rows (job/lifecycle.py): it
checks the input, fixes the plan every worker must share (a probe task prepares the model as a
worker would, without its weights), takes the output's lock, opens the result store, and decides
which rows still need to run (finished rows, and rows kept from an earlier input, are left out).
Ray Data then reads those rows (source.py), completes them on the workers (GemmaStage), and hands
them back here, where each is committed to the store as it arrives. So a killed job resumes from
the committed rows, a worker task Ray retries cannot commit a row twice, and the final file is
the one a local run writes: the same rows, in input order, the same schema and fingerprint.
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, TextIO

import numpy as np
import ray

from ..data.readers import Dataset
from ..engine.stats import EngineStats
from ..job.fingerprint import job_fingerprint, model_fingerprint
from ..job.incremental import EarlierRows
from ..job.lifecycle import (complete_stats, finish, open_input, open_store, report_kept, run_record, settle,
                             write_failed)
from ..job.lock import OutputLock
from ..job.model_setup import JobFailed, job_calibration, open_model
from ..job.progress import Progress
from ..job.signals import JobStopped, StopOnSignal
from ..job.spec import JobSpec
from ..job.store import ResultStore
from ..quantize.calibration import calibrated_label
from .cluster import Workers, connect, plan_workers, probe, root_cause, stats_board
from .source import JobRows
from .stage import GemmaStage, pool

BATCH_PER_SEQUENCE = 4  # rows a worker takes per call, per sequence of --max-batch


def run_ray_job(spec: JobSpec, address: str | None = None, workers: int | None = None,
                log: TextIO | None = None, out: TextIO | None = None) -> dict[str, Any]:
    """Run a job on a Ray cluster (`cluster.connect`: `address`) with `workers` workers
    (`cluster.plan_workers`) to the same final file a local run writes; return its statistics.
    Raises as `job.runner.run_job` does."""
    log, out = log or sys.stderr, out or sys.stdout
    dataset, schema = open_input(spec)
    folder, cfg, tokenizer, checkpoint = open_model(spec.model, log)  # a bad model fails here, named
    model = model_fingerprint(folder, checkpoint.files)
    weights = calibrated_label(spec.weight_format, checkpoint.layout, job_calibration(spec, tokenizer, cfg))
    started_here = not ray.is_initialized()
    connect(address, spec)
    try:
        with StopOnSignal() as stop:
            return _run(spec, dataset, schema, model, weights, workers, log, out, stop)
    except ray.exceptions.RayError as e:  # a task's or worker's own error, out of Ray's wrappers
        cause = root_cause(e)
        raise JobFailed(str(cause) if cause is not e else f"Ray: {e}") from None
    finally:
        if started_here:
            ray.shutdown()


def _run(spec: JobSpec, dataset: Dataset, schema, model: str, weights: str, wanted: int | None, log: TextIO,
         out: TextIO, stop: StopOnSignal) -> dict[str, Any]:
    plan, worker_spec = plan_workers(spec, wanted)
    found = probe(worker_spec, plan)
    print(f"ray: {plan.describe()}, on {found['identity']}", file=log)
    for line in found["log"].splitlines():
        print(f"  a worker: {line}", file=log)
    fingerprint = job_fingerprint(spec, dataset.fingerprint, model, found["identity"], found["max_model_len"], weights)
    with OutputLock(spec.output_path):
        store, earlier = open_store(spec, schema, fingerprint, dataset, log)
        if store.state == "complete":
            return complete_stats(spec, dataset)
        progress = Progress(dataset.num_rows, store.num_done, log, settle=spec.max_batch * plan.count)
        started, done_before = time.time(), store.num_done
        started_at = datetime.datetime.now(datetime.timezone.utc)
        board = stats_board()
        try:
            todo, count, kept = _todo(dataset, store, earlier, progress)
            done, failed = kept, 0
            if count:
                stage = {"spec": worker_spec, "expect": (found["identity"], found["max_model_len"]),
                         "keep_types": dataset.keep_types, "board": board}
                for row in _completed(spec, dataset, todo, count, plan, stage, stop):
                    if store.is_done(row["row"]):  # a retried task's row, committed when it first came
                        continue
                    if done == kept:  # the first: the progress line's rates count from the first worker's start too
                        progress.started = time.monotonic() - (time.time() - (ray.get(board.all.remote())[0] or started))
                    store.commit(row)
                    progress.update(1, row["completion_tokens"] or 0,
                                    prompt=(row["prompt_tokens"] or 0, row["cached_prompt_tokens"] or 0))
                    done, failed = done + 1, failed + (row["error"] is not None)
        except OSError as e:
            raise write_failed(e, store) from None
        ended = time.time()
        progress.close()
        report_kept(earlier, done, log)
        if stop.signum is not None:
            raise JobStopped(stop.signum, done)
        first_ready, reports = ray.get(board.all.remote())
        # a local job's clock starts once its model is loaded; a Ray job's once its first worker's is
        wall = ended - (first_ready or started)
        run = run_record(done, failed, done_before, earlier, started_at, wall)
        figures, per_worker = _figures(reports, wall, found, plan)
        figures["load_seconds"] = (first_ready or started) - started
        figures["weights"] = weights
        return finish(spec, store, dataset, run, figures, out, per_worker)


def _todo(dataset: Dataset, store: ResultStore, earlier: EarlierRows, progress: Progress
          ) -> tuple[np.ndarray | None, int, int]:
    """Which rows the workers must run: (a mask of them, None for all; their count; the rows
    committed here from `earlier`). A fresh job without earlier rows runs every row unread."""
    if not store.num_done and not earlier.total:
        return None, dataset.num_rows, 0
    todo = np.zeros(dataset.num_rows, dtype=bool)
    kept = 0
    for row in dataset.rows():
        settled = settle(row, store, earlier, progress)
        kept += settled == "kept"
        todo[row.index] = settled is None
    return todo, int(todo.sum()), kept


def _completed(spec: JobSpec, dataset: Dataset, todo: np.ndarray | None, count: int, plan: Workers,
               stage: dict[str, Any], stop: StopOnSignal):
    """The finished rows, as the workers hand them back (in no set order), until they are all
    back or a signal asks to stop."""
    rows_per_call = BATCH_PER_SEQUENCE * spec.max_batch
    here = {"ray.io/node-id": ray.get_runtime_context().get_node_id()}  # where the input is
    rows = ray.data.read_datasource(JobRows(dataset, todo, count, rows_per_call),
                                    num_cpus=0, label_selector=here)
    finished = rows.map_batches(GemmaStage, fn_constructor_kwargs=stage, batch_size=rows_per_call, batch_format="pyarrow",
                                compute=pool(plan.count), num_gpus=plan.gpus, num_cpus=plan.cpus)
    for batch in finished.iter_batches(batch_size=None, batch_format="pyarrow"):
        yield from batch.to_pylist()
        if stop.signum is not None:
            return


def _figures(reports: list[tuple[dict[str, Any], EngineStats]], wall: float, found: dict[str, Any], plan: Workers
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's engine figures (the workers' counts added up; prefill and decode tokens/s are
    the workers' rates added up, as they ran side by side) and each worker's own row."""
    merged = EngineStats()
    for _, stats in reports:
        merged.merge(stats)
    figures = {**merged.summary(wall),
               "prefill_tokens_per_s": sum(f["prefill_tokens_per_s"] for f, _ in reports),
               "decode_tokens_per_s": sum(f["decode_tokens_per_s"] for f, _ in reports),
               "backend": found["identity"], "kv_dtype": found["kv_dtype"], "worker": "all", "workers": plan.count}
    return figures, [f for f, _ in reports]
