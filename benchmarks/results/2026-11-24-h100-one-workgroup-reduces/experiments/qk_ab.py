"""The QK-norm/RoPE reduce with both of an invocation's values' chunk loads in flight at once and
its values straight into shared memory (.exp/qk/one.spv, from .exp/qk/reduce.comp -DQK_ONE_ROUND;
the same sums) against the shipped one: 4b logits of 7 decode steps, then the median decode step,
alternating, three rounds (batch 1 runs attention's QK_IN instead: a control)."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402

compare_builds(backend_4b(), [("shipped", []), ("one round", [["reduce_qk_rope_float16", "one.spv"]])], Path(".exp/qk"))
