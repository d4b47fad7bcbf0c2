"""Decode step time with the next matmul's first weights read into L2 during the kernel before it."""
import os, sys, time
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import graph as G
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

class ExpVariant(Kmod.Variant):
    @property
    def spv(self):
        return Path(__file__).resolve().parent / "prefetch.spv"
Kmod.VARIANTS["prefetch"] = ExpVariant("prefetch", "prefetch")
Kmod.PUSH["prefetch"] = np.dtype([("N", np.uint32), ("K", np.uint32), ("kchunk", np.uint32), ("gated", np.uint32)])

MODE = {"mb": 0}
orig_bind, orig_barrier = Kmod.Kernels._bind, Kmod.Kernels._barrier
def bind(self, cb, name, dset, push):
    if getattr(self, "_pending", False) and name != "prefetch":
        orig_barrier(self, cb)
        self._pending = False
    orig_bind(self, cb, name, dset, push)
def barrier(self, cb):
    self._pending = True
Kmod.Kernels._bind, Kmod.Kernels._barrier = bind, barrier

orig_dispatch = G.StepGraph._dispatch
def patched(self, name, buffers, push, grid):
    if MODE["mb"] and name.startswith("coop_") and not self.prefill and "_i8" not in name and "_i4" not in name:
        kchunk, N = push["kchunk"], push["N"]
        total = N // 128 * (push["K"] // kchunk)
        P = min(total, MODE["mb"] * (1 << 20) // (256 * kchunk))
        if P:
            dset = self.kernels.descriptor_set({0: buffers[0], 2: self.b.dummy, **({4: buffers[4]} if 4 in buffers else {})}, self.b.dummy)
            orig_bind(self.kernels, self.cb, "prefetch", dset, {"N": N, "K": push["K"], "kchunk": kchunk, "gated": int(4 in buffers)})
            self.kernels.vk.vkCmdDispatch(self.cb, P, 1, 1)
    orig_dispatch(self, name, buffers, push, grid)
G.StepGraph._dispatch = patched

shape = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
mbs = [int(m) for m in sys.argv[3].split(",")]
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for rep in range(2):
    for mb in mbs:
        for batch in batches:
            MODE["mb"] = mb
            backend._drop_graph()
            engine = prefilled_engine(backend, batch, 128, 48)
            times = []
            while engine.num_unfinished:
                s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
            step = float(np.median(times[4:]))
            print(f"{shape} b{batch} prefetch {mb} MB: {step*1e3:.3f} ms/step", flush=True)
