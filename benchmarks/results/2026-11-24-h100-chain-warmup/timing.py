"""Median 4b decode step (random bf16 weights, 128-token prompts), barriers against the chain.
usage: timing.py SHAPE BATCHES MODES [gen]   (modes: 0 barriers, 1 chain)"""
import os, sys, time
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

shape, batches, modes = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3].split(",")
gen = int(sys.argv[4]) if len(sys.argv) > 4 else 48
cfg = shape_config(shape)

for mode in modes:
    mode, _, run = mode.partition(":"); os.environ["GEMMA_BATCH_VK_CHAIN_RUN"] = run or "1000"
    os.environ["GEMMA_BATCH_VK_CHAIN"] = mode
    backend = VulkanBackend(cfg)
    backend.load_weights(random_tensors(cfg, 0))
    for b in batches:
        for rep in range(2):
            engine, secs = prefilled_engine(backend, b, 128, gen), []
            while engine.num_unfinished:
                t0 = time.perf_counter(); engine.step(); secs.append(time.perf_counter() - t0)
            s = np.array(secs[4:])
            tmo = backend.mem.download(backend.buffers.chain).view(np.uint32).reshape(-1, 16)[:, 1].sum()
            print(f"{shape} chain={mode}:{run} b{b}: median {1e3*np.median(s):.3f} ms, mean {1e3*s.mean():.3f}, timeouts {tmo}", flush=True)
    backend.close()
