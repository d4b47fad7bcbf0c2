"""What l2.py and sweep.py share: a device, buffers of random fp16, and chains of direct
dispatches timed on the GPU (a timestamp after each)."""
import numpy as np
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.timestamps import Timestamps


class Chains:
    def __init__(self) -> None:
        self.dev = Device()
        self.vk = self.dev.vk
        self.mem, self.kern = Memory(self.dev), Kernels(self.dev, kv_group=2, hidden=2560)
        self.junk = (np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32) * 0.02).astype(np.float16)
        self.meta = self.mem.alloc_host(16, "meta")
        self.sink = self.mem.alloc(4 * 4096 * 256, "sink")
        self.stamps = Timestamps(self.dev, 64)

    def filled(self, nbytes: int, label: str):
        """A device buffer of `nbytes` of small random fp16 values."""
        b = self.mem.alloc(nbytes, label)
        for off in range(0, nbytes, self.junk.nbytes):
            self.mem.upload(b, self.junk.view(np.uint8)[:min(self.junk.nbytes, nbytes - off)], off)
        return b

    def run(self, M: int, items, reps: int = 5, before=None) -> np.ndarray:
        """Median GPU us of each dispatch of `items` [(variant, descriptor set, push, groups)],
        recorded with barriers between and run `reps` times, for a step header of M rows;
        `before(cb)` records work ahead of the first timestamp. Frees the descriptor sets."""
        vk, kern = self.vk, self.kern
        self.meta.array[:16] = np.array([M, M, M, 0], np.uint32).view(np.uint8)
        cb = self.dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        self.stamps.reset(cb)
        if before is not None:
            before(cb)
        self.stamps.write(cb, 0)
        for i, (name, ds, push, groups) in enumerate(items):
            kern.record_direct(cb, name, ds, push, groups)
            self.stamps.write(cb, i + 1)
        vk.vkEndCommandBuffer(cb)
        out = []
        for _ in range(reps):
            self.dev.submit_and_wait(cb)
            out.append(self.stamps.seconds(len(items) + 1))
        vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [cb])
        kern.reset_sets()
        return np.median(np.array(out), axis=0) * 1e6
