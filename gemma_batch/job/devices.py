"""Which devices a job runs on: one backend (`--backend cpu|vulkan`, `--device`), or a placement
plan over several (`--place`, backends/placement.py).

Under `--backend auto` the plan is `--place auto` unless `--place` names one: the usable GPUs,
`--device`'s first, then discrete before integrated, each take in turn as many of the next
layers as fit in its memory (capped by `--gpu-memory`, less the step buffers the job's steps
take there) with the KV of one sequence of the job's longest length (what the engine must hold
to make progress); the CPU takes the rest. A model
that fits on the first GPU runs there alone, as a single backend; CPU Vulkan implementations
(llvmpipe) count only when `--device` (or GEMMA_BATCH_VK_DEVICE) names them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..backends import create_backend, create_placed, resolve_backend, resolve_placement
from ..backends.base import Backend
from ..backends.placement import Placement, PlacementError, parse_placement
from ..engine.footprint import auto_placement, footprint
from ..model.config import Gemma3Config
from ..model.quant import WeightFormat
from .spec import JobSpec, UsageError, parse_size

AUTO_CHUNK = 8192  # the prefill chunk auto plans with (the longest a backend takes by default)


def job_backend(spec: JobSpec, cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]]) -> tuple[Backend, str]:
    """The job's backend and why, for the log. UsageError for a plan that names no device for a
    part, or a device that is not here (the NPU: why not); ValueError from the backends."""
    limit = None if spec.gpu_memory is None else parse_size(spec.gpu_memory, 0, "--gpu-memory")
    fmt = spec.weight_format
    if spec.place is None and spec.backend != "auto":
        name, why = resolve_backend(spec.backend, spec.device)
        return create_backend(name, cfg, spec.device, spec.kv_dtype, fmt.name, memory_limit=limit), why
    try:
        if spec.place in (None, "auto"):
            placement, why = _auto(spec, cfg, layout, fmt, limit)
        else:
            placement, why = parse_placement(spec.place, cfg.num_layers), "--place"
        placement = resolve_placement(placement)
    except PlacementError as e:
        raise UsageError(str(e)) from None
    return create_placed(placement, cfg, layout, fmt, spec.kv_dtype, limit), why


def _step_buffer_bytes(cfg: Gemma3Config, gpu, spec: JobSpec, length: int) -> int:
    """Device bytes of the step buffers a job's steps take on `gpu` (a DeviceInfo), for steps of
    the job's budget (the backend's default: the longest there) over sequences of `length`
    tokens: what the engine reserves (`VulkanBackend.reserve`), before any backend exists."""
    from ..backends.vulkan import coopmat
    from ..backends.vulkan.attention import DEFAULT_CHUNK
    from ..backends.vulkan.coop_tiles import COOP_MIN_CHUNK
    from ..backends.vulkan.step_buffers import (PREFILL_STEP_TOKENS, ROWS_PER_SEQ, Capacity, first_capacity,
                                                scratch_sizes)

    coop = gpu.coopmat_fp16 and coopmat.wanted()
    tokens = spec.max_step_tokens or max(spec.max_batch, PREFILL_STEP_TOKENS if coop else 512)
    widths = tuple(sorted((g.name, -(-length // spec.block_size)) for g in cfg.kv_groups()))
    capacity = first_capacity(widths).grown_to(Capacity(tokens, spec.max_batch, ROWS_PER_SEQ * spec.max_batch, widths))
    sizes = scratch_sizes(cfg, capacity, spec.block_size, DEFAULT_CHUNK, COOP_MIN_CHUNK if coop else None, gpu.sm_count)
    return sum(size for size, _ in sizes.values())


def _auto(spec: JobSpec, cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]], fmt: WeightFormat,
          limit: int | None) -> tuple[Placement, str]:
    from ..backends.vulkan.backend import SCRATCH_RESERVE
    from ..backends.vulkan.device import DEVICE_ENV, choose_device, list_devices, usable_gpus

    wanted = spec.device or os.environ.get(DEVICE_ENV) or None
    name, why = resolve_backend("auto", wanted)
    if name == "cpu":
        return Placement.single("cpu", cfg.num_layers), why
    devices = list_devices()
    first = choose_device(usable_gpus(devices) if wanted is None else devices, wanted)
    gpus = [first] + [d for d in usable_gpus(devices) if d.index != first.index]
    length = min(spec.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    budgets = [(f"vulkan:{d.index}", int(min(d.device_local_bytes, limit or d.device_local_bytes) * (1 - SCRATCH_RESERVE))
                - _step_buffer_bytes(cfg, d, spec, length)) for d in gpus]
    fp = footprint(cfg, layout, fmt, spec.kv_dtype or "fp16")
    placement = auto_placement(fp, layout, budgets, length, 1, spec.block_size, spec.max_step_tokens or AUTO_CHUNK)
    if len(placement.devices) == 1 and placement.devices[0] != "cpu":
        return placement, f"auto: {first.name} holds the whole model"
    held = ", ".join(f"{sum(d == device for d in placement.ffn)} layers on {device}" for device in placement.devices)
    room = ", ".join(f"{d} {max(b, 0) / 2**30:.2f} GiB" if b >= 2**30 else f"{d} {max(b, 0) / 2**20:.1f} MiB" for d, b in budgets)
    return placement, (f"auto: {held}: as many layers as fit each GPU ({room} beside the step buffers) with one "
                       f"sequence of {length} tokens, the rest on the next device")
