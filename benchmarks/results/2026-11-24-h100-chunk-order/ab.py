"""K chunks fastest in the decode matmul's grid: 4b logits of 7 decode steps (must equal the shipped
build's), then the median decode step, shipped against the variant, alternating, three rounds."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import backend_4b, compare_builds  # noqa: E402

HERE = Path(".exp/cf")  # the variant's SPIR-V (README.md)
builds = [("shipped", []), ("cfast", [["coop_t16", "coop_t16.spv"], ["coop_gated_t16", "coop_gated_t16.spv"]])]
compare_builds(backend_4b(), builds, HERE)
