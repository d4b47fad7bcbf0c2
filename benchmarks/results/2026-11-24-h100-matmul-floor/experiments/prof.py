"""Per-dispatch GPU time of one 4b decode layer (profile timestamps), batch 1 and 32."""
import sys
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import median_step
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.graph import StepGraph
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

raw = []
orig = StepGraph.profile_seconds
def stash(self):
    raw.append((list(self.stamped), self.stamps.seconds(len(self.stamped) + 1)))
    return orig(self)
StepGraph.profile_seconds = stash
cfg = shape_config("4b")
backend = VulkanBackend(cfg, profile=True)
backend.load_weights(random_tensors(cfg, 0))
for batch in (1, 32):
    median_step(backend, batch, 8)
    raw.clear()
    median_step(backend, batch, 24)
    names = raw[-1][0]
    per = np.median(np.array([r[1] for r in raw[6:] if r[0] == names]), axis=0) * 1e6
    print(f"b{batch}: {len(names)} dispatches, total {per.sum():.0f} us")
    att = [i for i, n in enumerate(names) if n.startswith("attention")]
    start, end = att[10] - 2, att[11] - 2
    print("  layer 10: " + ", ".join(f"{names[i]} {per[i]:.1f}" for i in range(start, end)))
    kinds = {}
    for n, v in zip(names, per):
        kinds[n] = kinds.get(n, 0) + v
    print("  by name: " + ", ".join(f"{k} {v:.0f}" for k, v in kinds.items()))
    print("  first: " + ", ".join(f"{names[i]} {per[i]:.1f}" for i in range(0, 4)))
    print("  last: " + ", ".join(f"{names[i]} {per[i]:.1f}" for i in range(len(names) - 4, len(names))), flush=True)
