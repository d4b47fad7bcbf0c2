"""The device's streaming-read bandwidth, measured with `shaders/read_bandwidth.comp`.

The roofline of a decode step is its bytes read divided by this. The buffer should be several
times the device's last-level cache (1 GiB for an H100's 50 MB L2); it is capped at the
device's largest storage buffer and a quarter of its free memory.
"""

from __future__ import annotations

from .kernels import Kernels
from .memory import Memory
from .timestamps import best_dispatch_seconds

GROUPS = 4096  # x 256 invocations: enough in flight to saturate HBM
REPEATS = 5


def measure_read_bandwidth(kernels: Kernels, mem: Memory, nbytes: int) -> float:
    """Bytes per second: the best of REPEATS timed dispatches, each reading the buffer 4 times."""
    dev = kernels.dev
    nbytes = min(nbytes, dev.info.max_storage_buffer_range, mem.free_bytes() // 4) // 16 * 16
    data = mem.alloc(nbytes, "bandwidth test buffer")
    sink = mem.alloc(4 * GROUPS * 256, "bandwidth test output")
    try:
        dset = kernels.descriptor_set({0: data, 1: sink}, sink)
        iterations = 4
        best = best_dispatch_seconds(kernels, "read_bandwidth", dset, {"n": nbytes // 16, "iterations": iterations},
                                     GROUPS, REPEATS)
        return iterations * nbytes / best
    finally:
        mem.free(data)
        mem.free(sink)
