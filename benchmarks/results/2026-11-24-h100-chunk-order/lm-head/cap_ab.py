"""Whole 4b decode step, the LM head's decode matmul as a grid-stride loop over CAP workgroups
against the shipped grid (one tile a workgroup, 2,049 at batch 1-32): logits compared, then the
median step, alternating, three rounds."""
import sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step, use_build  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend, grids  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

CAP = int(sys.argv[1]) if len(sys.argv) > 1 else 528
HERE = Path(".exp/gs")
state = {"cap": False}
original = grids.DispatchGrids.counts

def capped(self, num_tokens, num_rows, positions):
    out = original(self, num_tokens, num_rows, positions)
    if state["cap"]:
        for i, (rows, kind, n, chunks, window) in enumerate(self._parsed):
            if rows and kind.startswith("coop_") and int(out[i, 0]) * int(out[i, 1]) > CAP:
                out[i] = (CAP, 1, 1)
    return out

grids.DispatchGrids.counts = capped
builds = [("shipped", []), (f"grid-stride {CAP}", [["coop_rows_t16", "gs_rows.spv"]])]
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for label, swaps in builds:
    use_build(backend, builds, swaps, HERE)
    state["cap"] = bool(swaps)
    for batch in (1, 32):
        print(f"{label} 4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
for rep in range(3):
    for label, swaps in builds:
        use_build(backend, builds, swaps, HERE)
        state["cap"] = bool(swaps)
        for batch in (1, 32):
            t = time.time()
            while time.time() - t < 1.0:
                median_step(backend, batch, 12)
            print(f"{label} 4b b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
