"""The review's mend (reduce.comp's gather4, sample.comp's keep_max: the same arithmetic) against
`559f977`'s kernels (`head_*.spv`): the logits hashes (must agree), then the median 4b decode
step at batch 1 and 32, alternating, three rounds.

    python3 ab_head.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import alternate_settings, from_files  # noqa: E402

HERE = Path(__file__).resolve().parent
NAMES = ("reduce_gated_split", "reduce_gated_split_rows", "reduce_post_norm", "reduce_post_norm_split", "reduce_rows", "sample")


if __name__ == "__main__":
    alternate_settings([("tree", from_files({})), ("559f977", from_files({n: HERE / f"spv/head_{n}.spv" for n in NAMES}))])
