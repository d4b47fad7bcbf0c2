"""attention with each lane's first V pieces of a pass loaded before the scores (V_AHEAD,
vahead.diff; vahead_*.spv from build.sh, float16 pages) against the shipped build: logits hashes
(must agree) and the median 4b decode step at batch 1 and 32, alternating (common.compare_builds).

    python3 vahead.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b, compare_builds  # noqa: E402

HERE = Path(__file__).resolve().parent
AHEAD = [[n, f"vahead_{n}.spv"] for n in ("attention_float16", "attention_float16_split", "attention_float16_split_qk")]
compare_builds(backend_4b(), [("shipped", []), ("V ahead", AHEAD)], HERE)
