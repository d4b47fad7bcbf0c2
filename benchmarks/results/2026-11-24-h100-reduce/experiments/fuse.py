"""Median decode step with the post-norm reduce fused up to F rows, for several F and batches."""
import sys, time
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

shape = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
fuses = [int(f) for f in sys.argv[3].split(",")]
cfg = shape_config(shape)
for fuse in fuses:
    backend = VulkanBackend(cfg, coop_fuse_rows=fuse)
    backend.load_weights(random_tensors(cfg, 0))
    for batch in batches:
        engine = prefilled_engine(backend, batch, 128, 48)
        times = []
        while engine.num_unfinished:
            s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
        print(f"{shape} b{batch} fuse={fuse}: {np.median(times[4:])*1e3:.3f} ms/step", flush=True)
    backend.close()
