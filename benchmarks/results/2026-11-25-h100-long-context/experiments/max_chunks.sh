#!/bin/bash
# Attention's MAX_CHUNKS (the most chunks a query's keys are cut into before the span doubles):
# the shipped 32 against 16 and 8, at long contexts. Each variant runs from a copy of the tree with
# its attention SPIR-V for fp16 KV pages (built here by sed on shaders/attention.comp, in spv-N/) and attention.py's
# MAX_CHUNKS changed. Run on the GPU machine from the repository root, after gpu_session.sh's setup:
#   bash benchmarks/results/2026-11-25-h100-long-context/experiments/max_chunks.sh "32 16 8" "1,8,32" 2048 64
set -e
variants=$1 batches=$2 prompt=$3 gen=$4
here=$(cd "$(dirname "$0")" && pwd)
for n in $variants; do
  tree=/tmp/tree-$n
  rm -rf "$tree"; cp -r "$PWD" "$tree"
  if [[ $n != 32 ]]; then
    cp "$here/spv-$n"/*.spv "$tree/gemma_batch/backends/vulkan/spv/"
    sed -i "s/^MAX_CHUNKS = 32 /MAX_CHUNKS = $n /" "$tree/gemma_batch/backends/vulkan/attention.py"
  fi
  grep -n "^MAX_CHUNKS" "$tree/gemma_batch/backends/vulkan/attention.py"
  (cd "$tree" && PYTHONPATH="$HOME/site:$tree" python3 -m gemma_batch bench --shape 4b --batch "$batches" \
     --prompt-len "$prompt" --gen-len "$gen" --backend vulkan --json "$OUT/max$n-p$prompt.json" > "$OUT/max$n-p$prompt.txt" 2>&1) || true
  echo "MAX_CHUNKS $n, prompt $prompt:"; tail -4 "$OUT/max$n-p$prompt.txt"
done
