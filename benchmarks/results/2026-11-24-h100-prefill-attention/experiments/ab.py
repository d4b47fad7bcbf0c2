"""The decode steps' attention kernels after the change (precise sums, shared chunk code, 1 / sum
by rcp_det) against the build before (.exp/pa/old_*.spv): 4b logits of 7 decode steps per build,
then the median decode step, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402

HERE = Path(".exp/pa")
old = [[n, f"old_{n}.spv"] for n in ("attention_float16_split", "attention_float16_split_qk")]
compare_builds(backend_4b(), [("new", []), ("old", old)], HERE)
