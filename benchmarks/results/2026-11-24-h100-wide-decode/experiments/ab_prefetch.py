"""Weights read into L2 ahead of their matmul (GEMMA_BATCH_VK_PREFETCH, prefetch.py, with
prefetch.diff applied to the tree; not kept) against none:
the logits hashes (prefetching changes no result, so they must agree), then the median 4b decode
step at batch 1 and 32, the settings alternating, three rounds.

    python3 ab_prefetch.py 'o_proj:1' 'o_proj:1,qkv:0.5;after;groups=66' ..."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import alternate_settings  # noqa: E402


def use(spec: str):
    """spec: FRACTIONS[;after][;groups=N] (after: the prefetch recorded after the kernel it runs beside)."""
    def setup(backend) -> None:
        fractions, *opts = spec.split(";")
        os.environ["GEMMA_BATCH_VK_PREFETCH"] = fractions
        os.environ.pop("PREFETCH_AFTER", None)
        os.environ.pop("PREFETCH_GROUPS", None)
        for opt in opts:
            if opt == "after":
                os.environ["PREFETCH_AFTER"] = "1"
            elif opt.startswith("groups="):
                os.environ["PREFETCH_GROUPS"] = opt.split("=")[1]
    return setup


if __name__ == "__main__":
    specs = ["", *sys.argv[1:]]
    alternate_settings([(spec or "none", use(spec)) for spec in specs])
