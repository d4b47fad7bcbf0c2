"""Other builds of a kernel (spv/LABEL_<kernel>.spv, from build_tree.py or an earlier commit's
spv/) against the tree's: the driver's registers and binary size, the logits hashes (a build that
sums alike must agree), then the median 4b decode step at batch 1 and 32, the builds alternating,
three rounds. The decode attention (the default kernel) is specialised as the graph records it.

    python3 ab.py LABEL[,LABEL...] [KERNEL]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import alternate_settings, from_files, print_stats, shape_config  # noqa: E402

HERE = Path(__file__).resolve().parent
NAME = sys.argv[2] if len(sys.argv) > 2 else "attention_float16_split_qk"


if __name__ == "__main__":
    labels = sys.argv[1].split(",")
    cfg = shape_config("4b")
    special = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, 16, 64, 8) if NAME.endswith("_qk") else ()
    print_stats([("tree", NAME, None, special)] + [(lb, NAME, HERE / f"spv/{lb}_{NAME}.spv", special) for lb in labels])
    alternate_settings([("tree", from_files({}))] + [(lb, from_files({NAME: HERE / f"spv/{lb}_{NAME}.spv"})) for lb in labels])
