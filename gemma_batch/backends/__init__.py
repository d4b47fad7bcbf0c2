"""Backends run Gemma 3 steps on a device; `base.py` holds the contract.

`cpu` is the numpy float32 reference; `vulkan` runs compute shaders on any Vulkan device
(`gemma-batch devices` lists them). `auto` picks Vulkan when a GPU is present (a CPU Vulkan
implementation such as llvmpipe does not count: the numpy backend is the better CPU path).
"""

from __future__ import annotations

from ..model.config import Gemma3Config
from .base import Backend

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


def create_backend(name: str, cfg: Gemma3Config, device: str | None = None, kv_dtype: str | None = None,
                   weights: str = "bf16") -> Backend:
    """A backend by name; `device` picks the Vulkan device (index or name; see `gemma-batch devices`);
    `kv_dtype` the KV cache's storage (None: the backend's default). Raises ValueError when the
    backend cannot hold the weight format `weights` or the KV dtype."""
    if name == "cpu":
        from .cpu import CpuBackend as chosen
    elif name == "vulkan":
        from .vulkan import VulkanBackend as chosen
    else:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    if weights not in chosen.weight_formats:
        raise ValueError(f"the {name} backend cannot run {weights} weights yet (it has {', '.join(chosen.weight_formats)}); "
                         f"use --backend cpu or other --weights")
    options = {} if kv_dtype is None else {"kv_dtype": kv_dtype}
    if name == "vulkan":
        options["device"] = device
    return chosen(cfg, **options)
