"""Kernels padded with the same executed work as straight-line code (pad*u*: a large binary) or
as a loop (pad*l*: a small one), in the real 4b step: the driver's binary size, the logits hashes
(must agree with the shipped build's) and the median decode step at batch 1 and 32, alternating
(common.compare_builds). The difference between the unrolled and the looped build of the same
rounds is what the larger binary costs in a step.

    python3 pad.py                     # reduce_post_norm_split (2 a layer), pad.diff: padl/padu 64, 256
    python3 pad.py attention_float16_split,attention_float16_split_qk apadl256,apadu256   # pad_attention.diff
    python3 pad.py attention_float16_split,attention_float16_split_qk const              # const.diff

(spv/ from build_variants.py with those diffs, see the README)."""
import sys

from builds import HERE, print_stats
from common import backend_4b, compare_builds

NAMES = sys.argv[1].split(",") if len(sys.argv) > 1 else ["reduce_post_norm_split"]
LABELS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["padl64", "padu64", "padl256", "padu256"]
BUILDS = [("shipped", [])] + [(label, [[n, f"spv/{label}_{n}.spv"] for n in NAMES]) for label in LABELS]

if __name__ == "__main__":
    print_stats([(label, name, HERE / dict(swaps)[name] if swaps else None, ()) for label, swaps in BUILDS for name in NAMES])
    compare_builds(backend_4b(), BUILDS, HERE)
