"""GPU timestamps: how long the device spent on a recorded command buffer, and on each dispatch.

    stamps = Timestamps(device, count)
    stamps.reset(cb); stamps.write(cb, 0); ...dispatches...; stamps.write(cb, 1)
    submit and wait; stamps.seconds(2)  # [t1 - t0]

A query pool of `count` timestamps; `seconds(n)` reads the first n and returns the n - 1 gaps.
"""

from __future__ import annotations

import numpy as np

from .device import Device


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
