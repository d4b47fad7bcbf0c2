"""Decode step time with kinds of dispatches left out (timing only; results are garbage)."""
import re, sys, time
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan import graph as G
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

SKIP = [None]
orig = G.StepGraph._dispatch
def patched(self, name, buffers, push, grid):
    if SKIP[0] and re.search(SKIP[0], name):
        return
    orig(self, name, buffers, push, grid)
G.StepGraph._dispatch = patched

shape = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
configs = sys.argv[3].split(";")
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for skip in configs:
    SKIP[0] = skip or None
    for batch in batches:
        backend._drop_graph()
        engine = prefilled_engine(backend, batch, 128, 48)
        times = []
        while engine.num_unfinished:
            s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
        step = float(np.median(times[4:]))
        print(f"{shape} b{batch} skip={skip!r}: {step*1e3:.3f} ms/step", flush=True)
