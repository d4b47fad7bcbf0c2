"""The Ray cluster a job runs on: connecting, how many workers on what, the plan every worker
must share, and the actor that gathers the workers' statistics."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from dataclasses import dataclass
from typing import Any

import ray

from ..engine.stats import EngineStats
from ..job.model_setup import prepare_model
from ..job.spec import JobSpec, UsageError


@dataclass(frozen=True)
class Workers:
    """How a job's stage runs: `count` actors, each with `gpus` GPU (0 or 1) and `cpus` CPUs."""

    count: int
    gpus: int
    cpus: float

    def describe(self) -> str:
        return f"{self.count} worker(s), " + ("one GPU each" if self.gpus else f"{self.cpus:g} CPU(s) each")


def connect(address: str | None, spec: JobSpec) -> None:
    """Join the cluster at `address` ("auto": the one `ray start` made on this machine; None:
    RAY_ADDRESS's, else a new one here, whose GPUs are this machine's usable Vulkan GPUs)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    gpus = None
    if address == "local" and spec.backend != "cpu":
        from ..backends.vulkan.device import list_devices, usable_gpus
        from ..backends.vulkan.errors import VulkanUnavailable

        try:
            gpus = len(usable_gpus(list_devices()))
        except VulkanUnavailable:
            gpus = 0
    ray.init(address=address, num_gpus=gpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # the job prints its own progress
    ray.data.DataContext.get_current().enable_progress_bars = False


def plan_workers(spec: JobSpec, wanted: int | None) -> tuple[Workers, JobSpec]:
    """The workers for `--workers` (None: one per GPU of the cluster, else one per machine on the
    CPU), and the spec every worker runs (`--backend cpu` where they have no GPU)."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 1))
    if wanted is not None and wanted < 1:
        raise UsageError(f"--workers {wanted}: must be >= 1")
    if gpus and spec.backend != "cpu":
        if wanted is not None and wanted > gpus:
            raise UsageError(f"--workers {wanted}: the cluster has {gpus} GPU(s), one a worker (--backend cpu for CPU workers)")
        return Workers(wanted or gpus, 1, 1.0), spec
    if spec.backend == "vulkan":
        raise UsageError("--backend vulkan: the Ray cluster has no GPU (`ray start --num-gpus N` on a machine whose "
                         "GPUs Ray does not find itself)")
    count = wanted or len([n for n in ray.nodes() if n.get("Alive")])
    return Workers(count, 0, cpus // count if count <= cpus else cpus / count), dataclasses.replace(spec, backend="cpu")


def probe(spec: JobSpec, workers: Workers) -> dict[str, Any]:
    """What a worker would run on: its backend's `identity` and `kv_dtype`, its context
    (`max_model_len`) and its `log`, from a task with a worker's resources that prepares the
    model without reading its weights."""

    def prepare(spec: JobSpec) -> dict[str, Any]:
        from .stage import on_assigned_gpu

        log = io.StringIO()
        model = prepare_model(on_assigned_gpu(spec), log)
        return {"identity": model.backend.identity, "kv_dtype": model.backend.kv_dtype,
                "max_model_len": model.plan.max_model_len, "log": log.getvalue()}

    task = ray.remote(num_gpus=workers.gpus, num_cpus=0)(prepare)
    return ray.get(task.remote(spec))


def root_cause(error: BaseException) -> BaseException:
    """The exception a Ray task or worker raised, out of Ray's wrappers: a RayTaskError's `cause`,
    an ActorDiedError's RayTaskError (its argument), else `__cause__`."""
    while True:
        wrapped = [getattr(error, "cause", None), *getattr(error, "args", ()), error.__cause__]
        inner = next((e for e in wrapped if isinstance(e, BaseException) and e is not error), None)
        if inner is None:
            return error
        error = inner


class StatsBoard:
    """A Ray actor: when the first worker had its model loaded (`first_ready`, seconds since the
    epoch), and each worker's latest figures and engine statistics, by worker."""

    def __init__(self) -> None:
        self.workers: dict[str, tuple[dict[str, Any], EngineStats]] = {}
        self.first_ready: float | None = None

    def ready(self, when: float) -> None:
        self.first_ready = when if self.first_ready is None else min(self.first_ready, when)

    def report(self, worker: str, figures: dict[str, Any], stats: EngineStats) -> None:
        self.workers[worker] = (figures, stats)

    def all(self) -> tuple[float | None, list[tuple[dict[str, Any], EngineStats]]]:
        return self.first_ready, list(self.workers.values())


def stats_board() -> Any:
    """A new StatsBoard actor (no CPU of its own: it only keeps figures)."""
    return ray.remote(num_cpus=0)(StatsBoard).remote()
