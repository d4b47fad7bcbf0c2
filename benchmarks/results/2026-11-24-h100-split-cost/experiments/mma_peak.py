"""The matrix units' fp16 -> fp32 peak through VK_KHR_cooperative_matrix (mma_peak.comp), at a few
grids and per-subgroup tile counts; best GPU time of 5 submits.

    python3 mma_peak.py   (spv/mma_peak_TNxTM.spv built beside by build.sh)"""
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[4]))
sys.path.insert(0, str(HERE.parents[2]))  # benchmarks/: gemm_coop's register, a kernel built from a file
from gemm_coop import register  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402
from gemma_batch.backends.vulkan.timestamps import best_dispatch_seconds  # noqa: E402

TILES = [(2, 4), (2, 2), (4, 4)]
if __name__ == "__main__":
    for tn, tm in TILES:
        name = f"mma_peak_{tn}x{tm}"
        register(HERE / "spv" / f"{name}.spv", name)  # (the GEMM's push layout: K is the iterations)
    dev = Device(None)
    mem, kern = Memory(dev), Kernels(dev)
    sms = dev.info.sm_count
    a, b = mem.alloc(4096, "a"), mem.alloc(4096, "b")
    mem.upload(a, np.ones(2048, np.float16)); mem.upload(b, np.full(2048, 0.5, np.float16))
    iters = 4096
    for tn, tm in TILES:
        name = f"mma_peak_{tn}x{tm}"
        for per_sm in (1, 2, 3, 4, 8):
            groups = sms * per_sm
            c = mem.alloc(groups * 4 * tn * tm * 256 * 4, "c")
            dset = kern.descriptor_set({0: a, 1: b, 2: c}, c)
            sec = best_dispatch_seconds(kern, name, dset, {"M": 0, "N": 0, "K": iters, "pad": 0}, groups, 5)
            flops = groups * 4 * iters * tn * tm * 8192
            print(f"{tn}x{tm} tiles a subgroup, {per_sm} workgroups of 128 an SM ({groups}): "
                  f"{sec * 1e3:.3f} ms, {flops / sec / 1e12:.1f} TFLOP/s", flush=True)
            mem.free(c)
