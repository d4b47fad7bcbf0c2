"""Do the small kernels run slower between the weight streams? Per-kernel GPU time per 4b decode
step (profile timestamps, median over 40 steps after 128-token prompts) at batch 1 and 32:
the whole step; the step without the cooperative matmuls (their dispatches and barriers left
out: wrong results); and with the matmuls' weight-tile loads marked Nontemporal (nt_*.spv,
build.sh). Then the logits hashes and median wall step of the shipped and Nontemporal builds,
alternating (common.compare_builds).

    python3 interaction.py"""
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b, compare_builds, median_step, use_build  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend  # noqa: E402
from gemma_batch.backends.vulkan import graph as G  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

HERE = Path(__file__).resolve().parent
NT = [[n, f"nt_{n}.spv"] for n in ("coop_t16", "coop_gated_t16", "coop_rows_t16")]
BUILDS = [("shipped", []), ("nontemporal", NT)]
SKIP = [None]
orig = G.StepGraph._dispatch


def patched(self, name, buffers, push, grid):
    if SKIP[0] and re.search(SKIP[0], name):
        return
    orig(self, name, buffers, push, grid)


G.StepGraph._dispatch = patched

cfg = shape_config("4b")
prof = VulkanBackend(cfg, profile=True)
prof.load_weights(random_tensors(cfg, 0))
for label, swaps, skip in [("shipped", [], None), ("no matmuls", [], "^coop_"), ("nontemporal", NT, None),
                           ("shipped again", [], None)]:
    SKIP[0] = skip
    use_build(prof, BUILDS, swaps, HERE)
    for batch in (1, 32):
        kernels: dict[str, list[float]] = {}

        def record():
            for k, v in prof.profile_seconds().items():
                kernels.setdefault(k, []).append(v)
        median_step(prof, batch, 12)
        median_step(prof, batch, 44, record)
        med = {k: 1e3 * float(np.median(v[4:])) for k, v in kernels.items()}
        print(f"{label} b{batch}: total {sum(med.values()):.3f} ms; "
              + ", ".join(f"{k} {v:.3f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1])), flush=True)
SKIP[0] = None
prof.close()
compare_builds(backend_4b(), BUILDS, HERE)
