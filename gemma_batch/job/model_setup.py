"""A job's model, in two moves: `prepare_model` (the checkpoint's headers, the backend, the KV
plan: what the fingerprint needs, no weights read) and `ModelPlan.load` (the weights, the engine).

A complete job stops between the two and never reads its weights; a Ray job (ray_data/) prepares
once on the driver's side to fix the plan, then every worker prepares and loads its own copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..backends.base import Backend
from ..backends.pipeline import PipelineBackend
from ..backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from ..engine.engine import Engine
from ..engine.kv_plan import KVPlan, fit_to_rows, plan_kv
from ..model import sources
from ..model.checkpoint import Checkpoint
from ..model.config import Gemma3Config
from ..model.quant import weights_label
from ..model.read_ahead import read_ahead
from ..model.conversion import converted_nbytes_by_dtype
from ..model.quant_cache import cache_root, load_converted
from ..model.tokenizer import Tokenizer
from ..quantize.calibration import Calibration, calibrated_label, int4_calibration
from ..startup import phase, timed
from .devices import job_backend
from .row_bound import CountedRows, RowBound
from .row_requests import RowRequests
from .spec import JobSpec, UsageError, parse_size


class JobFailed(Exception):
    """The job cannot run or finish (exit code 1); nothing half-written is left as the output."""


@dataclass
class ModelPlan:
    """A job's model before its weights are read: config, tokenizer, checkpoint, backend, KV plan."""

    spec: JobSpec
    folder: Path  # the model's Hugging Face folder (model/sources.py)
    cfg: Gemma3Config
    tokenizer: Tokenizer
    checkpoint: Checkpoint
    backend: Backend
    plan: KVPlan
    step_tokens: int
    calibration: Calibration | None  # what int4's rounding is weighted by (quantize/calibration.py)

    def load(self, log: TextIO, counted: CountedRows | None = None) -> Engine:
        """Read the weights onto the backend and allocate the KV cache, cut to the rows `counted`
        meanwhile where given (`prepare_model`'s `recount`). JobFailed when the device runs out of
        memory or refuses a weight (a damaged one: a NaN the GPU's fp16 tiles would hide)."""
        spec = self.spec
        started = time.perf_counter()
        try:
            with phase("weights"):
                weights = load_converted(self.checkpoint, spec.weight_format, cache_root(), self.calibration)
                reader = read_ahead(weights.tensors)
                try:
                    self.backend.load_weights(timed(reader, "weights: read"))
                finally:
                    reader.close()
            if counted is not None:
                with phase("input: counting"):
                    self._fit(counted.bound())
                print(self.plan.describe(self.cfg.kv_groups()), file=log)
            engine = Engine(self.backend, self.plan, self.tokenizer, spec.max_batch, self.step_tokens,
                            prefix_cache=spec.prefix_cache)
        except (DeviceMemoryError, ValueError) as e:  # (ValueError: weights a backend cannot take, damaged ones)
            raise JobFailed(str(e)) from None
        print(f"model: {spec.model} loaded in {time.perf_counter() - started:.1f} s", file=log)
        if (budget := engine.scheduler.step_token_budget) < self.step_tokens and spec.max_step_tokens:
            print(f"notice: steps of at most {budget} tokens, not --max-step-tokens {spec.max_step_tokens}: "
                  f"a longer step's buffers would not fit {self.backend.identity}", file=log)
        elif not spec.max_step_tokens:
            print(f"steps: up to {budget} tokens (the backend's choice; --max-step-tokens sets it)", file=log)
        for line in weights.note:
            print(f"  {line}", file=log)
        return engine

    def _fit(self, rows: RowBound | None) -> None:
        """The KV plan cut to `rows` (None: left as it is)."""
        if rows is not None:
            groups = self.cfg.kv_groups()
            per_token = {g.name: self.backend.kv_bytes_per_token(g.name) for g in groups}
            self.plan = fit_to_rows(self.plan, groups, per_token, rows.rows, rows.tokens, self.spec.max_batch,
                                    self.step_tokens, rows.counted)

    @property
    def weights_label(self) -> str:
        """What the run's matrices are (model.quant.weights_label: fp32 for a float32 checkpoint), with
        int4's calibration (`calibrated_label`): the statistics and the job's fingerprint record it."""
        return calibrated_label(self.spec.weight_format, self.checkpoint.layout, self.calibration)

    def requests(self) -> RowRequests:
        """What turns this job's rows into engine requests (made before `load`: the grammar view
        of a job's constraint builds on a thread meanwhile)."""
        spec = self.spec
        return RowRequests(self.tokenizer, frozenset(self.cfg.eos_token_ids), spec.sampling, self.plan.max_model_len,
                           spec.constraint, self.cfg.vocab_size, spec.choices, spec.score_only)


def open_model(model: Path, log: TextIO) -> tuple[Path, Gemma3Config, Tokenizer, Checkpoint]:
    """`model.sources.open_model` (a folder, a GGUF file, an installed model's or a hub name,
    converted or fetched where needed; headers only), its failures a UsageError naming the
    folder or file."""
    try:
        return sources.open_model(model, log)
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None


def prepare_model(spec: JobSpec, log: TextIO, rows: RowBound | None = None, recount: bool = False) -> ModelPlan:
    """Open the model, choose the backend and plan the KV cache in the memory the weights will
    leave (cut to `rows`, the job's rows, where known: row_bound.py), saying each on `log` (the
    plan at `load` instead, with `recount`: the rows are to be counted meanwhile). UsageError for
    a bad model, plan or flag; JobFailed when the device is missing or the weights do not fit."""
    with phase("model files"):
        folder, cfg, tokenizer, checkpoint = open_model(spec.model, log)
    fmt = spec.weight_format
    try:
        with phase("device"):
            backend, why = job_backend(spec, cfg, checkpoint.layout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except (VulkanUnavailable, DeviceMemoryError) as e:
        raise JobFailed(str(e)) from None
    print(f"backend: {backend.identity} ({why}); weights {weights_label(fmt, checkpoint.layout)}", file=log)
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
    available = backend.available_memory()
    weight_bytes = backend.weight_bytes(converted_nbytes_by_dtype(checkpoint.layout, fmt))
    if weight_bytes >= available:
        raise JobFailed(f"the model's weights take {weight_bytes / 2**30:.2f} GiB on the {backend.name} backend "
                        f"but only {available / 2**30:.2f} GiB is free there; use --place auto (layers that do not fit "
                        "on the CPU), --backend cpu or a smaller model")
    budget = parse_size(spec.kv_memory, available - weight_bytes)
    step_tokens = spec.max_step_tokens or max(spec.max_batch, backend.default_step_tokens)
    groups = cfg.kv_groups()
    per_token = {g.name: backend.kv_bytes_per_token(g.name) for g in groups}
    plan = plan_kv(
        groups, per_token, budget, spec.block_size, max_model_len, spec.max_batch, step_tokens,
        {g.name: backend.max_kv_blocks(g.name, spec.block_size) for g in groups},
    )
    if plan.notice:
        print(f"notice: {plan.notice}", file=log)
    if rows is not None:  # (with `recount`, the bound by bytes stands should the count stop early)
        plan = fit_to_rows(plan, groups, per_token, rows.rows, rows.tokens, spec.max_batch, step_tokens)
    if not recount:
        print(plan.describe(groups), file=log)
    return ModelPlan(spec, folder, cfg, tokenizer, checkpoint, backend, plan, step_tokens,
                     job_calibration(spec, tokenizer, cfg))


def job_calibration(spec: JobSpec, tokenizer: Tokenizer, cfg: Gemma3Config) -> Calibration | None:
    """What the job's int4 rounding is weighted by (`quantize.calibration.int4_calibration`); a
    calibration text that cannot be read is a UsageError naming it."""
    try:
        return int4_calibration(spec.weight_format, tokenizer, cfg)
    except ValueError as e:
        raise UsageError(str(e)) from None
