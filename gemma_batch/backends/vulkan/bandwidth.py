"""The device's streaming-read bandwidth, measured with `shaders/read_bandwidth.comp`.

The roofline of a decode step is its bytes read divided by this. The buffer should be several
times the device's last-level cache (1 GiB for an H100's 50 MB L2); it is capped at the
device's largest storage buffer and a quarter of its free memory.
"""

from __future__ import annotations

from .kernels import Kernels
from .memory import Memory
from .timestamps import Timestamps

GROUPS = 4096  # x 256 invocations: enough in flight to saturate HBM
REPEATS = 5


def measure_read_bandwidth(kernels: Kernels, mem: Memory, nbytes: int) -> float:
    """Bytes per second: the best of REPEATS timed dispatches, each reading the buffer 4 times."""
    dev, vk = kernels.dev, kernels.vk
    nbytes = min(nbytes, dev.info.max_storage_buffer_range, mem.free_bytes() // 4) // 16 * 16
    data = mem.alloc(nbytes, "bandwidth test buffer")
    sink = mem.alloc(4 * GROUPS * 256, "bandwidth test output")
    stamps = Timestamps(dev, 2)
    cb = dev.command_buffer()
    try:
        dset = kernels.descriptor_set({0: data, 1: sink}, sink)
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        stamps.write(cb, 0)
        iterations = 4
        kernels.record_direct(cb, "read_bandwidth", dset, {"n": nbytes // 16, "iterations": iterations}, GROUPS)
        stamps.write(cb, 1)
        vk.vkEndCommandBuffer(cb)
        best = float("inf")
        for _ in range(REPEATS):
            dev.submit_and_wait(cb)
            best = min(best, float(stamps.seconds(2)[0]))
        return iterations * nbytes / best
    finally:
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
        stamps.free()
        mem.free(data)
        mem.free(sink)
