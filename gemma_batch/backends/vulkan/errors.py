"""Errors of the Vulkan backend, each with a message that says what to do instead."""

from __future__ import annotations


class VulkanUnavailable(RuntimeError):
    """No loader, no driver, no matching device, or a device without a feature the shaders need."""


class DeviceMemoryError(MemoryError):
    """A device allocation does not fit the device's memory (or one buffer's range)."""
