"""reduce_gated_split and reduce_post_norm_split builds against the shipped ones (SPIR-V in
.exp/gr, built by build.sh): 4b logits of 7 decode steps per build, then the median decode step
at batch 1, 4, 16 and 32, the builds alternating, two rounds, 1 s of warm-up before each."""
import sys
import time
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, logits_hashes, median_step, use_build  # noqa: E402

HERE = Path(".exp/gr")
G, P = "reduce_gated_split", "reduce_post_norm_split"
BUILDS = [
    ("shipped", []),
    ("gated whole rows, 512", [[G, "w512.spv"]]),
    ("gated whole rows, 1024", [[G, "w1024.spv"]]),
    ("gated pieces of 4096, 1024", [[G, "w1024p.spv"]]),
    ("gated whole rows, 256", [[G, "w256.spv"]]),
    ("post-norm one workgroup (timing)", [[P, "pn640.spv"]]),
    ("gated 1024 + post-norm one workgroup", [[G, "w1024.spv"], [P, "pn640.spv"]]),
]
BATCHES = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,4,16,32").split(",")]

backend = backend_4b()
for label, swaps in BUILDS:
    use_build(backend, BUILDS, swaps, HERE)
    for batch in (1, 32):
        print(f"{label} b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
for _ in range(2):
    for label, swaps in BUILDS:
        use_build(backend, BUILDS, swaps, HERE)
        for batch in BATCHES:
            start = time.time()
            while time.time() - start < 1.0:
                median_step(backend, batch, 12)
            print(f"{label} b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
