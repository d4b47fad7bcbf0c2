"""`GemmaStage`: gemma-batch as the engine inside each worker of a Ray Data `map_batches`.

An actor makes one stage: it loads the model once, on the GPU Ray gave it (or the CPU), and then
completes batch after batch. A batch holds the columns a job reads (`prompt` or `messages`, `id`,
the per-row parameters, `regex` / `json_schema` / `choices`; docs/RAY.md) and comes back with the
columns a job writes, the other input columns carried through. The engine is batch-invariant and
a row's sampling is keyed by its id, so a row's completion is the same whatever batch or worker
it lands in, and the same as `gemma-batch run` gives it.

`gemma-batch run --ray` feeds the stage rows its own readers made (`source.py`, column PACKED);
then the input's row numbers and kept columns come with them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..data.row_checks import RowSpec, make_row
from ..data.rows import CONSTRAINT_COLUMNS, ROW_PARAMS, InputRow
from ..data.schema import output_schema
from ..data.seen_ids import SeenIds
from ..engine.engine import Engine
from ..engine.request import Request
from ..job.model_setup import ModelPlan, prepare_model
from ..job.row_requests import RowFailure, RowRequests, error_row, output_row
from ..job.spec import JobSpec, make_spec
from ..job.store import KIND_KEY

PACKED = "_gemma_batch_row"  # a pickled InputRow, as source.py packs it
CALLS_PER_WORKER = 2  # batches a worker runs at once on its engine (`pool`)
_READ = ("messages", *ROW_PARAMS, *CONSTRAINT_COLUMNS)  # the columns a stage reads besides the prompt and id columns


class WorkerMismatch(RuntimeError):
    """A worker would compute rows differently from the job's plan (another device, a shorter context)."""


class GemmaStage:
    """A Ray Data callable class: `ds.map_batches(GemmaStage, fn_constructor_kwargs={"model": ...},
    batch_format="pyarrow", compute=pool(N), num_gpus=1)`.

    Settings are `gemma-batch run`'s, named like its flags (`max_tokens=8`, `choices=("yes", "no")`,
    `weights="int8"`); the input's id column (`id_column`, default "id") is required, as a row's
    id keys its sampling. `keep_columns=None` carries every input column the stage does not read.
    """

    def __init__(self, model: str | Path | None = None, *, spec: JobSpec | None = None,
                 expect: tuple[str, int] | None = None, keep_types: dict[str, pa.DataType] | None = None,
                 board: Any = None, **settings: Any) -> None:
        """`spec`, `expect`, `keep_types` and `board` are for `gemma-batch run --ray`: the job's
        spec, the backend identity and context its plan fixed (WorkerMismatch where this worker's
        differ), the types of the input's kept columns, and the actor that gathers each worker's
        statistics (`cluster.StatsBoard`)."""
        started = time.perf_counter()
        self.keep = settings.pop("keep_columns", None)
        self.keep_types = keep_types or {}
        self._packed_schema = output_schema(self.keep_types).append(pa.field(KIND_KEY, pa.string()))  # (rows of source.py)
        if spec is None:
            given = {"input": Path("<ray dataset>"), "model": model, **settings}
            spec = make_spec({k: v for k, v in given.items() if v is not None}, where="GemmaStage")
        self.spec = on_assigned_gpu(spec)
        self.model: ModelPlan = prepare_model(self.spec, sys.stderr)
        got = (self.model.backend.identity, self.model.plan.max_model_len)
        if expect is not None and got != expect:
            raise WorkerMismatch(f"worker {socket.gethostname()} would run on {got[0]} with a context of {got[1]} tokens; "
                                 f"the job's plan is {expect[0]} with {expect[1]}: every worker must compute alike")
        self.requests: RowRequests = self.model.requests()  # (first: its grammar view builds while the weights load)
        self.engine: Engine = self.model.load(sys.stderr)
        self.board = board
        self.load_seconds = time.perf_counter() - started
        self.ready_at = time.time()
        if board is not None:
            board.ready.remote(self.ready_at)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.rows = 0
        self.busy = 0.0  # seconds with at least one call running
        self._turn = threading.Condition()  # guards what follows; the engine is the stepping call's alone
        self._stepping = False  # a call is stepping the engine
        self._incoming: list[tuple[_Call, int, InputRow, Request]] = []  # rows for the engine's next step
        self._owners: dict[int, tuple[_Call, int, InputRow, Request]] = {}  # engine request id -> whose row
        self._next_id = 0
        self._calls = 0  # running
        self._since = 0.0  # when the running calls began

    def __call__(self, batch: pa.Table) -> pa.Table:
        """The batch's rows completed, in the batch's order. Calls may run at once, on threads
        (`pool`): their rows share one engine, which steps while any call has rows running, so
        the engine stays full from one batch to the next."""
        if not isinstance(batch, pa.Table):
            batch = pa.Table.from_pandas(batch, preserve_index=False)  # (batch_format="pandas")
        if PACKED in batch.column_names:
            out = self._complete([pickle.loads(b) for b in batch.column(PACKED).to_pylist()])
            schema = self._packed_schema
        else:
            kept = self._kept(batch)
            rows, numbers = self._rows(batch, kept)
            out = self._complete(rows)
            for values, number in zip(out, numbers):
                values["row"] = number
                del values[KIND_KEY]
            schema = _nullable_row(output_schema({n: batch.schema.field(n).type for n in kept}))
        return pa.Table.from_pylist(out, schema=schema)

    def _complete(self, rows: list[InputRow]) -> list[dict[str, Any]]:
        """Every row's output row (an error row where it cannot run), in the order of `rows`.
        A call hands its rows in, then either steps the engine (one call at a time, each step
        taking in every call's new rows) or waits for a step to finish them."""
        call = _Call(rows)
        requests = [self.requests.request(row) for row in rows]  # (tokenizing, while others step)
        with self._turn:
            if not self._calls:
                self._since = time.perf_counter()
            self._calls += 1
            for i, (row, request) in enumerate(zip(rows, requests)):
                if isinstance(request, RowFailure):
                    call.finish(i, error_row(row, request))
                else:
                    self._incoming.append((call, i, row, request))
        while True:
            with self._turn:
                while call.left and self._stepping:
                    self._turn.wait()
                if not call.left:
                    return self._leave(call)
                self._stepping = True
                incoming, self._incoming = self._incoming, []
            completions = []
            try:
                for owner, i, row, request in incoming:
                    self._owners[self._next_id] = (owner, i, row, request)
                    self.engine.add(dataclasses.replace(request, request_id=self._next_id))
                    self._next_id += 1
                completions = self.engine.step()
            finally:
                with self._turn:
                    for completion in completions:
                        owner, i, row, request = self._owners.pop(completion.request_id)
                        owner.finish(i, output_row(row, request, completion, self.spec.score_only))
                    self._stepping = False
                    self._turn.notify_all()

    def _leave(self, call: _Call) -> list[dict[str, Any]]:
        """A finished call's rows (holding `_turn`); its figures go to the board while no call steps."""
        self._calls -= 1
        self.rows += len(call.out)
        if not self._calls:
            self.busy += time.perf_counter() - self._since
        if self.board is not None and not self._stepping:
            self.board.report.remote(self.worker, self.statistics(), self.engine.stats)
        return call.out

    def statistics(self) -> dict[str, Any]:
        """This worker's figures so far: when its model was ready (and how long it took to get
        it there), rows, seconds in batches, and the engine's statistics."""
        ready = datetime.datetime.fromtimestamp(self.ready_at, datetime.timezone.utc)
        return {"worker": self.worker, "backend": self.model.backend.identity, "kv_dtype": self.model.backend.kv_dtype,
                "ready_at": ready.isoformat(timespec="milliseconds"), "load_seconds": self.load_seconds, "rows": self.rows,
                "busy_seconds": self.busy, "rows_per_s": self.rows / self.busy if self.busy else 0.0,
                **self.engine.stats.summary(self.busy)}

    def _kept(self, batch: pa.Table) -> list[str]:
        id_column = self.spec.id_column or "id"
        read = {self.spec.prompt_column, id_column, "row", *_READ}
        return [n for n in batch.column_names if n not in read] if self.keep is None else list(self.keep)

    def _rows(self, batch: pa.Table, kept: list[str]) -> tuple[list[InputRow], list[int | None]]:
        """The batch's records as InputRows (numbered by their place in the batch) with the
        `kept` columns, and each one's `row` (the input's own `row` column, else null)."""
        id_column = self.spec.id_column or "id"
        if id_column not in batch.column_names:
            raise ValueError(f"GemmaStage: the batch has no id column {id_column!r} (id_column=): a row's id keys its "
                             "sampling, so that its completion is the same wherever it runs; add one")
        missing = [n for n in kept if n not in batch.column_names]
        if missing:
            raise ValueError(f"GemmaStage: keep_columns {', '.join(missing)}: not columns of the batch")
        spec = RowSpec(self.spec.prompt_column, id_column, tuple(kept), self.spec.chat, keep_value=lambda v: v)
        records = batch.to_pylist()
        seen = SeenIds()
        rows = [make_row(i, f"row {record.get('row', i)}", record, spec, seen) for i, record in enumerate(records)]
        return rows, [record.get("row") for record in records]


class _Call:
    """One call's rows: their output rows as they finish, and how many are still running."""

    def __init__(self, rows: list[InputRow]) -> None:
        self.out: list[dict[str, Any]] = [{}] * len(rows)
        self.left = len(rows)

    def finish(self, i: int, values: dict[str, Any]) -> None:
        self.out[i] = values
        self.left -= 1


def pool(workers: int) -> Any:
    """The actor pool for GemmaStage: `workers` actors, each running two calls at once on one
    engine (`GemmaStage.__call__`), so that it never drains between batches."""
    import ray

    return ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=CALLS_PER_WORKER,
                                      max_concurrent_calls_per_actor=CALLS_PER_WORKER, enable_true_multi_threading=True)


def on_assigned_gpu(spec: JobSpec) -> JobSpec:
    """The spec with `--device` set to the GPU Ray gave this worker (its k-th GPU is the k-th
    usable Vulkan GPU), so that workers on one machine each run on their own; else as it is."""
    import ray

    ids = ray.get_gpu_ids() if ray.is_initialized() else []
    if not ids or spec.device is not None or spec.backend == "cpu":
        return spec
    from ..backends.vulkan.device import list_devices, usable_gpus

    gpus = usable_gpus(list_devices())
    k = int(ids[0])
    if k >= len(gpus):
        raise WorkerMismatch(f"Ray gave this worker GPU {k}, but Vulkan sees {len(gpus)} usable GPU(s) here")
    return dataclasses.replace(spec, backend="vulkan", device=str(gpus[k].index), place=None)


def _nullable_row(schema: pa.Schema) -> pa.Schema:
    """`schema` with a nullable `row` (a batch without a `row` column numbers nothing)."""
    i = schema.get_field_index("row")
    return schema.set(i, pa.field("row", pa.int64()))
