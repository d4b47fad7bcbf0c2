#!/bin/bash
# GPU machine, one call: the driver's SASS of the decode step's kernels at this tree, into
# $OUT/sass.tar.gz (the code-size folder's sass.py, extract.py and disasm.sh, run there; the
# zstandard wheel for extract.py is carried in spv/).
set -e
H=$(cd "$(dirname "$0")" && pwd)
C=$H/../../2026-11-24-h100-code-size/experiments
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" "$H"/spv/zstandard-*.whl
SPECIAL=256,8,4,16,64,8 python3 $C/sass.py attention_float16_split_qk
python3 $C/sass.py attention_float16_split,reduce_post_norm_split,reduce_gated_split,reduce_gated_split_rows,coop_t16,coop_gated_t16,coop_rows_t16,reduce_rows,sample
python3 $C/extract.py "$OUT/sass"
bash $C/disasm.sh
tar czf "$OUT/sass.tar.gz" -C "$OUT" sass && rm -rf "$OUT/sass"
