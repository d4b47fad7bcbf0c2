"""The decode steps' attention kernels after the change (precise sums, shared chunk code, 1 / sum
by rcp_det) against the build before (.exp/pa/old_*.spv): 4b logits of 7 decode steps per build,
then the median decode step, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import alternate, logits_hashes, use_build  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

HERE = Path(".exp/pa")
old = [[n, f"old_{n}.spv"] for n in ("attention_float16_split", "attention_float16_split_qk")]
builds = [("new", []), ("old", old)]
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for label, swaps in builds:
    use_build(backend, builds, swaps, HERE)
    for batch in (1, 32):
        print(f"{label} 4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
alternate(backend, builds, HERE)
