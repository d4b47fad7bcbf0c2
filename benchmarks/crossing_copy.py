"""The host copy of a crossing between two Vulkan devices (issue 52): numpy copies from a readback
buffer (cached host memory, where a stage writes x_out) into a host-visible one (where the next
stage reads x_in), best of 20 (5 at 8,192 tokens), at 27b's hidden size. Run once, 2026-11-28."""
import time, numpy as np
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.memory import Memory
for idx in ("0", "1"):
    dev = Device(idx); mem = Memory(dev)
    for tokens in (1, 32, 8192):
        n = tokens * 5376 * 4
        src = mem.alloc_host(n, "x_out", readback=True)   # where GPU A writes (cached host memory)
        dst = mem.alloc_host(n, "x_in")                   # what GPU B reads (host-visible)
        a = src.array.view(np.float32); b = dst.array.view(np.float32)
        a[:] = 1.0
        best = 1e9
        for _ in range(20 if tokens < 8192 else 5):
            t = time.perf_counter(); b[:] = a; best = min(best, time.perf_counter() - t)
        print(f"device {idx} {dev.info.name}: {tokens} tokens, {n} bytes: host copy {best*1e3:.3f} ms ({n/best/1e9:.1f} GB/s)")
        mem.free(src); mem.free(dst)
    mem.close(); dev.close()
