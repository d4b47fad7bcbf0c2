"""The tree's build (the LM head's decode matmul looping over SM-capped workgroups) against the
build before (7d4cdc5's SPIR-V of the three fp16-tile decode matmuls, uncapped grid): 4b logits of
7 decode steps, then the median step alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402
from gemma_batch.backends.vulkan import grids  # noqa: E402

HERE = Path(".exp/prev")
PER_SM = grids.ROWS_GROUPS_PER_SM
builds = [("tree", []), ("before", [[n, f"{n}.spv"] for n in ("coop_t16", "coop_gated_t16", "coop_rows_t16")])]
backend = backend_4b()
print("SMs:", backend.device.info.sm_count, flush=True)


def uncapped(swaps):
    grids.ROWS_GROUPS_PER_SM = 0 if swaps else PER_SM


compare_builds(backend, builds, HERE, before=uncapped)
