"""Median 4b decode step for other K-chunk rules of the cooperative matmuls (COOP_TARGET_GROUPS,
coop_min_chunk); prints each matrix's chunks and workgroups."""
import sys
from common import median_step
from gemma_batch.backends.vulkan import coop_tiles
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.step_buffers import coop_matmuls
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

shape, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
cfg = shape_config(shape)
for spec in sys.argv[3].split(";"):
    target, min_chunk = (int(v) for v in spec.split(","))
    coop_tiles.COOP_TARGET_GROUPS = target
    shapes = {k: (n * w, K, coop_tiles.coop_chunks(n * w, K, min_chunk)) for k, (n, w, K, _) in coop_matmuls(cfg).items()}
    desc = ", ".join(f"{k} {c} chunks/{N // 128 * c} wg" for k, (N, K, c) in shapes.items())
    backend = VulkanBackend(cfg, coop_min_chunk=min_chunk)
    backend.load_weights(random_tensors(cfg, 0))
    for rep in range(2):
        for batch in batches:
            step = median_step(backend, batch, 48)
            print(f"{shape} b{batch} target {target} min_chunk {min_chunk}: {step*1e3:.3f} ms/step  [{desc}]", flush=True)
    backend.close()
    del backend
