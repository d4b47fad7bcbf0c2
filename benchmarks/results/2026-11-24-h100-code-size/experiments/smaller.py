"""Kernels with the same arithmetic and smaller binaries against the shipped ones: the driver's
binary size and registers of each, then the logits hashes (must agree) and the median 4b decode
step at batch 1 and 32, alternating (common.compare_builds).

    python3 smaller.py

Builds (spv/ from build_variants.py): `rolled` (rolled.diff: [[dont_unroll]] on attention's
loops that had no unroll attribute), `nochunks` (nochunks.diff: reduce_gated_split_rows without
its path for more than 2 K chunks, which no Gemma 3 shape takes; an experiment only)."""
from builds import HERE, print_stats
from common import backend_4b, compare_builds

ATTN = ("attention_float16_split", "attention_float16_split_qk")
ROLLED = [[n, f"spv/rolled_{n}.spv"] for n in ATTN]
NOCHUNKS = [["reduce_gated_split_rows", "spv/nochunks_reduce_gated_split_rows.spv"]]
BUILDS = [("shipped", []), ("rolled", ROLLED), ("nochunks", NOCHUNKS), ("both", ROLLED + NOCHUNKS)]

if __name__ == "__main__":
    print_stats([(label, name, HERE / spv if spv else None, ()) for name, spv in ROLLED + NOCHUNKS
                 for label, spv in (("shipped", None), ("smaller", spv))])
    compare_builds(backend_4b(), BUILDS, HERE)
