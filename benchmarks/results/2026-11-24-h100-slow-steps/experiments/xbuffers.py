"""The decode matmul with x staged in two shared-memory buffers in turn (one barrier a stage; the
tree this runs in) against the build before (two barriers a stage, before_*.spv, build.sh):
logits hashes (must agree) and the median 4b decode step at batch 1 and 32, alternating
(common.compare_builds).

    python3 xbuffers.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b, compare_builds  # noqa: E402

HERE = Path(__file__).resolve().parent
BEFORE = [[n, f"before_{n}.spv"] for n in ("coop_t16", "coop_gated_t16", "coop_rows_t16")]
compare_builds(backend_4b(), [("one buffer", BEFORE), ("two buffers", [])], HERE)
