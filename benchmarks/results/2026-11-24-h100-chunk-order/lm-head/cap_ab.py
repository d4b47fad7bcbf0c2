"""Whole 4b decode step, the LM head's decode matmul as a grid-stride loop over CAP workgroups
against the shipped grid (one tile a workgroup, 2,049 at batch 1-32): logits compared, then the
median step, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402
from gemma_batch.backends.vulkan import grids  # noqa: E402

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
compare_builds(backend_4b(), builds, HERE, before=lambda swaps: state.update(cap=bool(swaps)))
