"""Other builds of a set of kernels (the attention-code folder's spv/LABEL_<kernel>.spv, from its
build_tree.py) against the tree's:
the driver's registers and binary size, the logits hashes (builds that sum alike must agree), then
the median 4b decode step at batch 1 and 32, the builds alternating, three rounds.

    python3 ab_set.py LABEL[,LABEL...] KERNEL[,KERNEL...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import alternate_settings, from_files, print_stats  # noqa: E402

SPV = Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention-code/experiments/spv"
NAMES = sys.argv[2].split(",")


if __name__ == "__main__":
    labels = sys.argv[1].split(",")
    print_stats([(lb, n, SPV / f"{lb}_{n}.spv" if lb != "tree" else None, ()) for lb in ["tree", *labels] for n in NAMES])
    alternate_settings([("tree", from_files({}))] + [(lb, from_files({n: SPV / f"{lb}_{n}.spv" for n in NAMES}))
                                                     for lb in labels])
