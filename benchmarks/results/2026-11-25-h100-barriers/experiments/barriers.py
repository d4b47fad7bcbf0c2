"""Experiment: what the memory barrier after each dispatch costs beside the execution dependency.

Every dispatch the backend records is followed by a pipeline barrier with a memory barrier
(shader writes -> shader reads and writes, Kernels._barrier). A dependent dispatch costs
2.57-2.85 us through Vulkan where a CUDA graph's costs 0.94-1.37 us (docs/PERFORMANCE.md, "A
calibration on CUDA"). This asks how much of that is the memory barrier (cache maintenance)
rather than the execution dependency (wait for idle), with three kinds of barrier after each
dispatch:
  memory  the shipped barrier;
  exec    the same stages, no memory barrier: an execution dependency only (not enough under
          the Vulkan memory model for the step's plain loads and stores: timing, and a look at
          whether the logits change in practice);
  none    no barrier (the dispatches may overlap).
1. A chain of 136 dispatches of read_bandwidth.comp doing nothing (0 iterations) or one pass over
   1 MiB, at 1, 132 and 528 workgroups: GPU us per dispatch.
2. The real 4b step (random weights, 128-token prompts): logits hashes of 7 decode steps at batch 1
   and 32 per kind (memory, exec), then the median decode step, the kinds alternating, two rounds.
usage: barriers.py [chain|step]..."""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks/results/2026-11-24-h100-attention/experiments"))
from common import backend_4b, logits_hashes, settings_in_turn  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402
from gemma_batch.backends.vulkan.timestamps import Timestamps  # noqa: E402

KIND = {"barrier": "memory"}
CHAIN = 136
orig_barrier = Kmod.Kernels._barrier


def barrier(self, cb, *args, **kwargs):
    """The barrier after each dispatch (called with no arguments) by KIND; begin/end_step's as shipped."""
    kind = KIND["barrier"]
    if args or kwargs or kind == "memory":
        orig_barrier(self, cb, *args, **kwargs)
    elif kind == "exec":
        stage = self.vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        self.vk.vkCmdPipelineBarrier(cb, stage, stage, 0, 0, None, 0, None, 0, None)


Kmod.Kernels._barrier = barrier


def chain() -> None:
    dev = Device()
    kern, mem = Kernels(dev), Memory(dev)
    vk = dev.vk
    warm_bytes = min(1 << 30, dev.info.max_storage_buffer_range) // 16 * 16
    warm, data, sink = mem.alloc(warm_bytes, "warm"), mem.alloc(1 << 20, "data"), mem.alloc(4 << 20, "sink")
    stamps = Timestamps(dev, 2)
    dset_warm, dset = kern.descriptor_set({0: warm, 1: sink}, sink), kern.descriptor_set({0: data, 1: sink}, sink)
    print(dev.info.name, flush=True)

    def us_per_dispatch(groups: int, iterations: int, repeats: int = 5) -> float:
        cb = dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        kind, KIND["barrier"] = KIND["barrier"], "memory"
        for _ in range(4):  # the clocks up before the timed chain
            kern.record_direct(cb, "read_bandwidth", dset_warm, {"n": warm_bytes // 16, "iterations": 1}, 4096)
        KIND["barrier"] = kind
        stamps.write(cb, 0)
        for _ in range(CHAIN):
            kern.record_direct(cb, "read_bandwidth", dset, {"n": (1 << 20) // 16, "iterations": iterations}, groups)
        stamps.write(cb, 1)
        vk.vkEndCommandBuffer(cb)
        out = []
        for _ in range(repeats):
            dev.submit_and_wait(cb)
            out.append(stamps.seconds(2)[0])
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
        return float(np.median(out)) / CHAIN * 1e6

    us_per_dispatch(132, 1)  # pipelines built
    for rnd in range(2):
        for iterations in (0, 1):
            for groups in (1, 132, 528):
                row = []
                for kind in ("memory", "exec", "none"):
                    KIND["barrier"] = kind
                    row.append(f"{kind} {us_per_dispatch(groups, iterations):.2f}")
                KIND["barrier"] = "memory"
                print(f"round {rnd}, {iterations} passes over 1 MiB, {groups} workgroups of 256: "
                      + " | ".join(row) + " us/dispatch", flush=True)


def step() -> None:
    backend = backend_4b()
    for kind in ("memory", "exec", "memory"):
        KIND["barrier"] = kind
        backend._drop_graph()
        for batch in (1, 32):
            print(f"{kind} barriers 4b b{batch}: logits {logits_hashes(backend, batch)}", flush=True)
    settings_in_turn(backend, [("memory barriers", "memory"), ("execution-only barriers", "exec")],
                     lambda kind: KIND.update(barrier=kind))


if __name__ == "__main__":
    for part in sys.argv[1:] or ["chain", "step"]:
        {"chain": chain, "step": step}[part]()
