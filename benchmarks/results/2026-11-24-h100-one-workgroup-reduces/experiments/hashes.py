"""The 4b logits hashes of 7 decode steps at batch 1 and 32 of the tree this runs in (the same
before and after a change that keeps the sums)."""
import sys
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, logits_hashes  # noqa: E402

backend = backend_4b()
for batch in (1, 32):
    print(f"4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
