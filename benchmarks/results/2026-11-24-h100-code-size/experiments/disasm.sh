#!/bin/bash
# Step 3 of 3 (GPU machine): disassemble spv/code/*.bin (extract.py) into $OUT/sass/<name>.sass.
cd "$(dirname "$0")"
mkdir -p "$OUT/sass"
for f in spv/code/*.bin; do
  n=$(basename "$f" .bin)
  /usr/local/cuda/bin/nvdisasm -b SM90 "$f" > "$OUT/sass/$n.sass" 2>&1
  echo "$n: $(grep -c ';' "$OUT/sass/$n.sass") instructions"
done
