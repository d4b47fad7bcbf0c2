"""Decode step time: indirect vs direct dispatches (grids fixed at record time), barrier off."""
import re, sys, time
import numpy as np
from gemma_batch.backends.vulkan import graph as G
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.kernels import META_BINDING
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

MODE = {"direct": False, "skip": None, "batch": 1, "nobarrier": False}
orig_barrier = Kmod.Kernels._barrier
def barrier(self, cb):
    if not MODE["nobarrier"]:
        orig_barrier(self, cb)
Kmod.Kernels._barrier = barrier

def patched(self, name, buffers, push, grid):
    if MODE["skip"] and re.search(MODE["skip"], name):
        return
    dset = self.kernels.descriptor_set({META_BINDING: self.inp.meta, **buffers}, self.b.dummy)
    off = self.grid_slots.offset(*grid)
    if MODE["direct"] and not self.prefill:
        B = MODE["batch"]
        counts = self.grid_slots.counts(B, B, np.full(B, 191))
        x, y, z = (int(v) for v in counts[off // 12])
        if x == 0:
            return
        self.kernels._bind(self.cb, name, dset, push)
        self.kernels.vk.vkCmdDispatch(self.cb, x, y, z)
        self.kernels._barrier(self.cb)
    else:
        self.kernels.record(self.cb, name, dset, push, self.inp.grids, off)
G.StepGraph._dispatch = patched

shape = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for label, direct, skip, nob in [("indirect", False, None, False), ("direct", True, None, False),
                                 ("direct-reduce", True, "reduce", False), ("direct-nobarrier", True, None, True),
                                 ("indirect-nobarrier", False, None, True)]:
    for batch in batches:
        MODE.update(direct=direct, skip=skip, batch=batch, nobarrier=nob)
        backend._drop_graph()
        engine = prefilled_engine(backend, batch, 128, 48)
        times = []
        while engine.num_unfinished:
            s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
        step = float(np.median(times[4:]))
        print(f"{shape} b{batch} {label}: {step*1e3:.3f} ms/step", flush=True)
