"""Kernels dispatched by themselves, outside a step graph, for the tests of single shaders.

    with Dispatches(tokens=5) as d:
        x = d.upload(array, "x")
        y = d.alloc(4 * 5 * 64, "y")
        d.dispatch("split_plain", {1: x, 2: y}, {"K": 64, "eps": 1e-6}, groups=5)
        d.run()
        out = d.download(y).view(np.float32)

Dispatches are recorded in order into one command buffer, each followed by the kernels' usual
barrier, with the step header (binding 7) holding the given token, sequence and row counts.
"""

from __future__ import annotations

import numpy as np

from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import META_BINDING, Kernels
from gemma_batch.backends.vulkan.memory import Buffer, Memory


class Dispatches:
    """A device with its memory and kernels (`Kernels` options passed through), one command
    buffer of direct dispatches; closing (or leaving the `with`) frees everything."""

    def __init__(self, tokens: int, seqs: int = 1, rows: int | None = None, **kernel_options) -> None:
        self.device = Device()
        self.mem, self.kernels = Memory(self.device), Kernels(self.device, **kernel_options)
        self.meta = self.mem.alloc_host(20, "step header")  # (common.glsl; no prompt tokens: prompt_start = T)
        self.meta.array[:20] = np.array([tokens, seqs, tokens if rows is None else rows, 0, tokens], np.uint32).view(np.uint8)
        self._cb = None

    def __enter__(self) -> Dispatches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def alloc(self, nbytes: int, name: str) -> Buffer:
        return self.mem.alloc(nbytes, name)

    def upload(self, array: np.ndarray, name: str) -> Buffer:
        """A new device buffer holding `array`'s bytes."""
        buf = self.mem.alloc(array.nbytes, name)
        self.mem.upload(buf, np.ascontiguousarray(array))
        return buf

    def dispatch(self, name: str, buffers: dict[int, Buffer], push: dict[str, float | int], groups: int,
                 specialize: bool = False) -> None:
        """Record kernel `name` over `groups` workgroups with `buffers` by binding (the step header
        at binding 7, unused bindings get it too); `specialize` as Kernels.record."""
        vk = self.device.vk
        if self._cb is None:
            self._cb = self.device.command_buffer()
            vk.vkBeginCommandBuffer(self._cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        dset = self.kernels.descriptor_set({**buffers, META_BINDING: self.meta}, self.meta)
        self.kernels.record_direct(self._cb, name, dset, push, groups, specialize)

    def run(self) -> None:
        """Submit what was recorded and wait for it."""
        self.device.vk.vkEndCommandBuffer(self._cb)
        self.device.submit_and_wait(self._cb)

    def download(self, buf: Buffer) -> np.ndarray:
        """The buffer's bytes, as a new uint8 array."""
        return self.mem.download(buf)

    def close(self) -> None:
        self.kernels.close()
        self.mem.close()
        self.device.close()
