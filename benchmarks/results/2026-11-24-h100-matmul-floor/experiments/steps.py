"""Median 4b decode step at several batches, two rounds, and the logits bits of 7 steps (hashes),
for whichever gemma_batch is first on the path. usage: steps.py LABEL BATCHES"""
import sys
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step
import gemma_batch
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

label, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
print(label, gemma_batch.__file__, flush=True)
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for batch in (1, 32):
    hashes = ','.join(logits_hashes(backend, batch))
    print(f"{label} b{batch} logits {hashes}", flush=True)
for rep in range(2):
    for batch in batches:
        print(f"{label} b{batch}: {median_step(backend, batch, 64)*1e3:.3f} ms/step", flush=True)
