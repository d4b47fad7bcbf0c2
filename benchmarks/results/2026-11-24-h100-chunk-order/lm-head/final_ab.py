"""The tree's build (the LM head's decode matmul looping over SM-capped workgroups) against the
build before (7d4cdc5's SPIR-V of the three fp16-tile decode matmuls, uncapped grid): 4b logits of
7 decode steps, then the median step alternating, three rounds."""
import sys, time
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step, use_build  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend, grids  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

HERE = Path(".exp/prev")
PER_SM = grids.ROWS_GROUPS_PER_SM
builds = [("tree", []), ("before", [[n, f"{n}.spv"] for n in ("coop_t16", "coop_gated_t16", "coop_rows_t16")])]
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
print("SMs:", backend.device.info.sm_count, flush=True)
backend.load_weights(random_tensors(cfg, 0))

def use(label, swaps):
    grids.ROWS_GROUPS_PER_SM = 0 if swaps else PER_SM
    use_build(backend, builds, swaps, HERE)

for label, swaps in builds:
    use(label, swaps)
    for batch in (1, 32):
        print(f"{label} 4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
for rep in range(3):
    for label, swaps in builds:
        use(label, swaps)
        for batch in (1, 32):
            t = time.time()
            while time.time() - t < 1.0:
                median_step(backend, batch, 12)
            print(f"{label} 4b b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
