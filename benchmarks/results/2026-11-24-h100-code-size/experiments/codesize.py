"""Experiment: GPU microseconds per dispatch of a chain of dependent dispatches (a barrier after
each, as a step records them) of codesize.comp, unrolled (large binary) against looped (small
binary, the same work), cycling through 1 or 4 distinct binaries, at several grid sizes.

    python3 benchmarks/results/2026-11-24-h100-code-size/experiments/codesize.py

Run build.sh here first (glslc) and carry spv/ to the GPU machine."""
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.backends.vulkan import pipeline_stats
from gemma_batch.backends.vulkan.bandwidth import GROUPS
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.timestamps import Timestamps

SPV = Path(__file__).resolve().parent / "spv"
CHAIN = 136  # dispatches timed per chain (4 a layer of 34, as many as a step's reduces)
ITERS = (8, 64, 256, 640)


def variant(name: str) -> str:
    path = SPV / f"{name}.spv"

    class V(Variant):
        @property
        def spv(self) -> Path:
            return path
    Kmod.VARIANTS[f"cs_{name}"] = V(f"cs_{name}", "read_bandwidth")
    return f"cs_{name}"


def main() -> None:
    dev = Device(capture_statistics=True)
    kern, mem = Kernels(dev), Memory(dev)
    vk = dev.vk
    warm_bytes = min(1 << 30, dev.info.max_storage_buffer_range) // 16 * 16
    warm = mem.alloc(warm_bytes, "warm")
    data = mem.alloc(16 * 65536, "data")
    sink = mem.alloc(4 * 65536 * 128, "sink")
    print(dev.info.name, flush=True)
    for it in ITERS:
        for kind in ("unroll", "loop"):
            name = variant(f"{kind}_{it}_0")
            if dev.statistics:
                s = pipeline_stats.statistics(kern, name)
                print(f"  {kind} {it}: registers {s.get('Register Count')}, binary {s.get('Binary Size')} B", flush=True)
    stamps = Timestamps(dev, 2)
    dset_warm = kern.descriptor_set({0: warm, 1: sink}, sink)
    dset = kern.descriptor_set({0: data, 1: sink}, sink)

    def chain_us(names: list[str], push: dict, groups: int, repeats: int = 5) -> float:
        cb = dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        for _ in range(4):  # the clocks up before the timed chain
            kern.record_direct(cb, "read_bandwidth", dset_warm, {"n": warm_bytes // 16, "iterations": 1}, GROUPS)
        stamps.write(cb, 0)
        for i in range(CHAIN):
            kern.record_direct(cb, names[i % len(names)], dset, push, groups)
        stamps.write(cb, 1)
        vk.vkEndCommandBuffer(cb)
        out = []
        for _ in range(repeats):
            dev.submit_and_wait(cb)
            out.append(stamps.seconds(2)[0])
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
        return float(np.median(out)) / CHAIN * 1e6

    start = time.perf_counter()
    while time.perf_counter() - start < 0.6:
        chain_us([variant("loop_8_0")], {"n": 65536, "iterations": 1}, 132, repeats=1)
    for rnd in range(2):
        for groups in (1, 20, 132, 528):
            print(f"round {rnd}, {groups} workgroups of 128:", flush=True)
            base = chain_us([variant("loop_8_0")], {"n": 65536, "iterations": 0}, groups)
            print(f"  no rounds (loop build, 0 iterations): {base:.2f} us/dispatch", flush=True)
            for it in ITERS:
                row = []
                for kind in ("unroll", "loop"):
                    for nbin in (1, 4):
                        names = [variant(f"{kind}_{it}_{s}") for s in range(nbin)]
                        us = chain_us(names, {"n": 65536, "iterations": it // 8}, groups)
                        row.append(f"{kind} x{nbin} {us:6.2f}")
                print(f"  {it:4d} rounds: " + " | ".join(row) + " us/dispatch", flush=True)


if __name__ == "__main__":
    main()
