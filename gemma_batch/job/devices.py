"""Which devices a job runs on: one backend (`--backend cpu|vulkan`, `--device`), or a placement
plan over several (`--place`, backends/placement.py).

Under `--backend auto` the plan is `--place auto` unless `--place` names one: the usable GPUs,
`--device`'s first, then discrete before integrated, each take in turn as many of the next
layers as fit in its memory (capped by `--gpu-memory`) beside room for one sequence's KV and
the step buffers (AUTO_LENGTH, AUTO_STEP_TOKENS); the CPU takes the rest. A model
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
from .spec import JobSpec, UsageError, parse_size

# What --place auto keeps room for on a GPU beside its layers' weights: the KV of one sequence of
# the job's longest length, up to AUTO_LENGTH tokens, and the step buffers of steps of the job's
# budget, up to AUTO_STEP_TOKENS. The engine then sizes both within what is left (the KV cache
# lowers the model length with a notice, the steps shrink); planning for a 128K-token sequence
# and 8,192-token steps would have put 27b's last layer on the CPU of an 80 GB GPU.
AUTO_LENGTH = 8192
AUTO_STEP_TOKENS = 512


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
            placement, why = _auto(spec, cfg, layout, limit)
        else:
            placement, why = parse_placement(spec.place, cfg.num_layers), "--place"
        placement = resolve_placement(placement)
    except PlacementError as e:
        raise UsageError(str(e)) from None
    return create_placed(placement, cfg, layout, fmt, spec.kv_dtype, limit), why


def _step_buffer_bytes(cfg: Gemma3Config, gpu, spec: JobSpec, length: int) -> int:
    """Device bytes of the step buffers (as `VulkanBackend.reserve` makes them) on `gpu` (a
    DeviceInfo) for steps of the job's budget, up to AUTO_STEP_TOKENS, over sequences of
    `length` tokens, before any backend exists."""
    from ..backends.vulkan import coopmat
    from ..backends.vulkan.attention import DEFAULT_CHUNK
    from ..backends.vulkan.coop_tiles import COOP_MIN_CHUNK
    from ..backends.vulkan.step_buffers import ROWS_PER_SEQ, Capacity, first_capacity, scratch_sizes

    coop = gpu.coopmat_fp16 and coopmat.wanted()
    tokens = max(spec.max_batch, min(spec.max_step_tokens or AUTO_STEP_TOKENS, AUTO_STEP_TOKENS))
    widths = tuple(sorted((g.name, -(-length // spec.block_size)) for g in cfg.kv_groups()))
    capacity = first_capacity(widths).grown_to(Capacity(tokens, spec.max_batch, ROWS_PER_SEQ * spec.max_batch, widths))
    sizes = scratch_sizes(cfg, capacity, spec.block_size, DEFAULT_CHUNK, COOP_MIN_CHUNK if coop else None, gpu.sm_count)
    return sum(size for size, _ in sizes.values())


def _auto(spec: JobSpec, cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]],
          limit: int | None) -> tuple[Placement, str]:
    from ..backends.vulkan.device import DEVICE_ENV, choose_device, list_devices, usable_gpus

    wanted = spec.device or os.environ.get(DEVICE_ENV) or None
    name, why = resolve_backend("auto", wanted)
    if name == "cpu":
        return Placement.single("cpu", cfg.num_layers), why
    devices = list_devices()
    first = choose_device(usable_gpus(devices) if wanted is None else devices, wanted)
    return plan_gpus(spec, cfg, layout, [first] + [d for d in usable_gpus(devices) if d.index != first.index], limit)


def plan_gpus(spec: JobSpec, cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]], gpus: list,
              limit: int | None) -> tuple[Placement, str]:
    """`--place auto` over `gpus` (DeviceInfos, in the order they take layers), then the CPU."""
    from ..backends.vulkan.backend import SCRATCH_RESERVE

    fmt, first = spec.weight_format, gpus[0]
    length = min(spec.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings, AUTO_LENGTH)
    budgets = [(f"vulkan:{d.index}", int(min(d.device_local_bytes, limit or d.device_local_bytes) * (1 - SCRATCH_RESERVE))
                - _step_buffer_bytes(cfg, d, spec, length)) for d in gpus]
    fp = footprint(cfg, layout, fmt, spec.kv_dtype or "fp16")
    placement = auto_placement(fp, layout, budgets, length, 1, spec.block_size, min(spec.max_step_tokens or AUTO_STEP_TOKENS, AUTO_STEP_TOKENS))
    if len(placement.devices) == 1 and placement.devices[0] != "cpu":
        return placement, f"auto: {first.name} holds the whole model"
    held = ", ".join(f"{sum(d == device for d in placement.ffn)} layers on {device}" for device in placement.devices)
    room = ", ".join(f"{d} {max(b, 0) / 2**30:.2f} GiB" if b >= 2**30 else f"{d} {max(b, 0) / 2**20:.1f} MiB" for d, b in budgets)
    return placement, (f"auto: {held}: as many layers as fit each GPU ({room} beside the step buffers) with one "
                       f"sequence of {length} tokens, the rest on the next device")
