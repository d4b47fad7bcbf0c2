"""The Vulkan backend: device layer (`device`, `memory`, `kernels`; `coopmat` and `coop_tiles` for
the tensor-core path), the model's buffers (`weights`, `step_buffers`), the recorded step
(`graph`, `grids`), the shapes it handles (`supported`) and the `Backend` itself (`backend`; a
pipeline stage: `stage`)."""

from .backend import VulkanBackend
from .device import DeviceInfo, list_devices
from .errors import DeviceMemoryError, VulkanUnavailable

__all__ = ["DeviceInfo", "DeviceMemoryError", "VulkanBackend", "VulkanUnavailable", "list_devices"]
