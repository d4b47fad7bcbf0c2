"""Other builds of a set of kernels (the attention-code folder's spv/LABEL_<kernel>.spv, from its
build_tree.py) against the tree's:
the driver's registers and binary size, the logits hashes (builds that sum alike must agree), then
the median 4b decode step at batch 1 and 32, the builds alternating, three rounds.

    python3 ab_set.py LABEL[,LABEL...] KERNEL[,KERNEL...]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import Kmod, alternate_settings, print_stats  # noqa: E402
from common import file_variant  # noqa: E402

SPV = Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention-code/experiments/spv"
NAMES = sys.argv[2].split(",")
TREE = {name: Kmod.VARIANTS[name] for name in NAMES}


def use(label: str | None):
    def setup(backend) -> None:
        for name, v in TREE.items():
            Kmod.VARIANTS[name] = file_variant(name, v.source, SPV / f"{label}_{name}.spv") if label else v
        backend.kernels.pipelines.clear()
    return setup


if __name__ == "__main__":
    labels = sys.argv[1].split(",")
    print_stats([(lb, n, SPV / f"{lb}_{n}.spv" if lb != "tree" else None, ()) for lb in ["tree", *labels] for n in NAMES])
    alternate_settings([("tree", use(None))] + [(lb, use(lb)) for lb in labels])
