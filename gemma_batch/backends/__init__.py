"""Backends run Gemma 3 steps on a device; `base.py` holds the contract.

`cpu` is the numpy float32 reference; `vulkan` runs compute shaders on any Vulkan device
(`gemma-batch devices` lists them). `auto` picks Vulkan when a GPU is present (a CPU Vulkan
implementation such as llvmpipe does not count: the numpy backend is the better CPU path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..model.config import Gemma3Config
from ..model.quant import WeightFormat
from .base import Backend
from .placement import Placement, PlacementError, Segment

BACKENDS = ("cpu", "vulkan")


def resolve_backend(name: str, device: str | None = None) -> tuple[str, str]:
    """The backend `name` stands for, and why, for the job's log."""
    if name == "auto":
        from .vulkan.device import VulkanUnavailable, choose_device, list_devices

        try:
            devices = list_devices()
        except VulkanUnavailable as e:
            return "cpu", f"auto: no Vulkan ({str(e).split(':')[0]})"
        gpus = [d for d in devices if d.type_code != 4]
        if device is not None:
            return "vulkan", f"auto: --device {device} given"
        if not gpus:
            return "cpu", "auto: no Vulkan GPU found (only CPU implementations)"
        usable = [d for d in gpus if not d.shortfalls()]
        if not usable:
            return "cpu", f"auto: Vulkan GPU {gpus[0].name} lacks {'; '.join(gpus[0].shortfalls())}"
        gpus = usable
        chosen = choose_device(gpus, None)
        return "vulkan", f"auto: Vulkan GPU {chosen.name}"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: auto, {', '.join(BACKENDS)}")
    return name, "chosen with --backend"


def default_kv_dtype(name: str) -> str:
    """The KV cache's storage on backend `name` (cpu, vulkan) when a job names none."""
    if name == "cpu":
        from .cpu import CpuBackend as chosen
    else:
        from .vulkan import VulkanBackend as chosen
    return chosen.default_kv_dtype


def create_backend(name: str, cfg: Gemma3Config, device: str | None = None, kv_dtype: str | None = None,
                   weights: str = "bf16", segments: Sequence[Segment] | None = None,
                   memory_limit: int | None = None) -> Backend:
    """A backend by name; `device` picks the Vulkan device (index or name; see `gemma-batch devices`);
    `kv_dtype` the KV cache's storage (None: the backend's default); `segments` the parts it runs
    as a pipeline stage (None: the whole model); `memory_limit` the most memory a Vulkan device
    may plan to hold (--gpu-memory; None: what is free). Raises ValueError when the backend cannot hold
    the weight format `weights` or the KV dtype."""
    if name == "cpu":
        from .cpu import CpuBackend as chosen
    elif name == "vulkan" and segments is not None:
        from .vulkan.stage import VulkanStage as chosen
    elif name == "vulkan":
        from .vulkan import VulkanBackend as chosen
    else:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    if weights not in chosen.weight_formats:
        raise ValueError(f"the {name} backend cannot run {weights} weights yet (it has {', '.join(chosen.weight_formats)}); "
                         f"use --backend cpu or other --weights")
    options = {} if kv_dtype is None else {"kv_dtype": kv_dtype}
    if segments is not None:
        options["segments"] = segments
    if name == "vulkan":
        options["device"] = device
        options["memory_limit"] = memory_limit
    return chosen(cfg, **options)


def resolve_placement(placement: Placement) -> Placement:
    """`placement` with each Vulkan device named by its index (`vulkan:NVIDIA` -> `vulkan:0`), so
    that two names of one GPU are one stage. Raises PlacementError for an NPU (no stage runs
    there yet: npu/README.md), with the reason when there is none, and VulkanUnavailable for a
    Vulkan device that is not here."""
    if "npu" in placement.devices:
        from .npu_device import find_npus

        npus, why_not = find_npus()
        raise PlacementError(f"--place names the NPU, but {why_not or f'no NPU stage is built yet ({npus[0]} found; npu/README.md)'}")
    names = {d: d for d in placement.devices}
    if any(d.startswith("vulkan:") for d in names):
        from .vulkan.device import choose_device, list_devices

        devices = list_devices()
        names = {d: f"vulkan:{choose_device(devices, d[len('vulkan:'):]).index}" if d.startswith("vulkan:") else d
                 for d in names}
    return Placement(*(tuple(names[d] for d in devs) for devs in (placement.attention, placement.ffn)),
                     names[placement.embed], names[placement.head])


def create_placed(placement: Placement, cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]],
                  weights: WeightFormat, kv_dtype: str | None = None, memory_limit: int | None = None) -> Backend:
    """The backend that runs a resolved `placement` (`resolve_placement`): the device's own where
    the plan uses one device, else a pipeline of one stage per device (`pipeline.py`)."""
    def make(device: str, segments: list[Segment] | None = None) -> Backend:
        name, index = ("cpu", None) if device == "cpu" else ("vulkan", device[len("vulkan:"):])
        return create_backend(name, cfg, index, kv_dtype, weights.name, segments, memory_limit)

    if len(placement.devices) == 1:
        return make(placement.devices[0])
    from .pipeline import PipelineBackend

    segments = placement.segments()
    stages = {d: make(d, [s for s in segments if s.device == d]) for d in placement.devices}
    return PipelineBackend(cfg, placement, stages, layout, weights)
