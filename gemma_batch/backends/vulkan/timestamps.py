"""GPU timestamps: how long the device spent on a recorded command buffer, and on each dispatch.

    stamps = Timestamps(device, count)
    stamps.reset(cb); stamps.write(cb, 0); ...dispatches...; stamps.write(cb, 1)
    submit and wait; stamps.seconds(2)  # [t1 - t0]

A query pool of `count` timestamps; `seconds(n)` reads the first n and returns the n - 1 gaps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .device import Device

if TYPE_CHECKING:
    from .kernels import Kernels


class Timestamps:
    def __init__(self, device: Device, count: int) -> None:
        vk = self.vk = device.vk
        self.dev, self.count = device, count
        self.pool = vk.vkCreateQueryPool(device.device, vk.VkQueryPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=count), None)
        self._out = np.zeros(count, np.uint64)

    def reset(self, cb) -> None:
        self.vk.vkCmdResetQueryPool(cb, self.pool, 0, self.count)

    def write(self, cb, index: int) -> None:
        """Record timestamp `index`, taken when every earlier command has finished."""
        if index >= self.count:  # past the pool: the device's behaviour would be undefined (a hang, on the H100)
            raise RuntimeError(f"timestamp {index} of a pool of {self.count}: make the pool larger")
        self.vk.vkCmdWriteTimestamp(cb, self.vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.pool, index)

    def seconds(self, n: int) -> np.ndarray:
        """[n - 1] seconds between consecutive timestamps of the last submit (waited for)."""
        vk = self.vk
        vk.vkGetQueryPoolResults(self.dev.device, self.pool, 0, n, 8 * n, vk.ffi.from_buffer(self._out), 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        ticks = np.diff(self._out[:n].astype(np.int64))
        return ticks * (self.dev.info.timestamp_period * 1e-9)

    def free(self) -> None:
        self.vk.vkDestroyQueryPool(self.dev.device, self.pool, None)


def best_dispatch_seconds(kernels: Kernels, name: str, dset, push: dict[str, float | int], groups: int,
                          repeats: int) -> float:
    """The shortest GPU time of `repeats` submits of one dispatch of kernel `name` (benchmarks)."""
    dev, vk = kernels.dev, kernels.vk
    stamps = Timestamps(dev, 2)
    cb = dev.command_buffer()
    try:
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        stamps.write(cb, 0)
        kernels.record_direct(cb, name, dset, push, groups)
        stamps.write(cb, 1)
        vk.vkEndCommandBuffer(cb)
        best = float("inf")
        for _ in range(repeats):
            dev.submit_and_wait(cb)
            best = min(best, float(stamps.seconds(2)[0]))
        return best
    finally:
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
        stamps.free()
