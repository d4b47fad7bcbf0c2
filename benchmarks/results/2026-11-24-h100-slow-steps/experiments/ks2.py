"""The decode matmul with 2 k blocks a stage instead of 4 (ks2.diff, ks2_*.spv; fewer weight tiles
held, so fewer registers; the same sums in the same order): its registers and workgroups an SM,
then logits hashes (must agree) and the median 4b decode step at batch 1 and 32 against the
shipped build, alternating (common.compare_builds).

    python3 ks2.py"""
from pathlib import Path

from stats_builds import NAMES, print_stats
from common import backend_4b, compare_builds  # noqa: E402 (stats_builds puts common on the path)

HERE = Path(__file__).resolve().parent
print_stats([("2 k blocks a stage,", "ks2_")])
compare_builds(backend_4b(), [("4 k blocks a stage", []), ("2 k blocks a stage", [[n, f"ks2_{n}.spv"] for n in NAMES])], HERE)
