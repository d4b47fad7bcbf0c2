"""Timing only (wrong results): the decode matmul reading its weight tiles as if each workgroup's
8 column tiles were stored stage by stage contiguously. Median 4b step, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import alternate  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

HERE = Path(".exp/lay")
builds = [("shipped", []), ("wg-contiguous", [["coop_t16", "coop_t16.spv"], ["coop_gated_t16", "coop_gated_t16.spv"]])]
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
alternate(backend, builds, HERE)
