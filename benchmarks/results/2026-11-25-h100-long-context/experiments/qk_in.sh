#!/bin/bash
# qk_in.py on and off, alternating, at each prompt length. From the repository root on the GPU
# machine, after gpu_session.sh's setup:  bash .../qk_in.sh "128 2048" "1,32" 64
here=$(cd "$(dirname "$0")" && pwd)
for prompt in $1; do for mode in on off; do
  python3 "$here/qk_in.py" $mode --shape 4b --batch "$2" --prompt-len $prompt --gen-len "$3" --backend vulkan \
    --json "$OUT/qk-$mode-p$prompt.json" > "$OUT/qk-$mode-p$prompt.txt" 2>&1
  echo "QK_IN $mode, prompt $prompt:"; tail -3 "$OUT/qk-$mode-p$prompt.txt"
done; done
