"""Review of the QK-norm/RoPE reduce: its chunk sums through CHUNK_SUM on vec2 (this tree) against
two scalar sums written out (6922965's SPIR-V in .exp/rv/head.spv): 4b logits of 7 decode steps
(must agree), then the median decode step, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402

compare_builds(backend_4b(), [("vec2", []), ("6922965", [["reduce_qk_rope_float16", "head.spv"]])], Path(".exp/rv"))
