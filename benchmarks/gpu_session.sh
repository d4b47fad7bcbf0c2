#!/bin/bash
# One call's worth of work on the GPU machine (the `device` tool): set up Vulkan and the wheels
# (see shared/device/README.md), then run what $1 names. Usage, from the repository root there:
#   bash benchmarks/gpu_session.sh tests|bench|profile|all [extra pytest or bench arguments]
set -o pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$HOME/site" .whl/*.whl
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=$1; shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m gemma_batch devices 2>&1 | head -8
if [[ $what == tests || $what == all ]]; then
  # One pytest process per file: several Vulkan test files in one process have crashed at exit there.
  for f in tests/test_vulkan_flash.py tests/test_vulkan_split.py tests/test_vulkan_coopmat.py tests/test_vulkan_backend.py tests/test_vulkan_step_limits.py \
           tests/test_batch_invariance.py tests/test_vulkan_kv_dtypes.py tests/test_vulkan_quant.py tests/test_vulkan_job.py \
           tests/test_vulkan_attention.py tests/test_vulkan_choices.py tests/test_prefix_cache.py tests/test_pipeline.py; do
    python3 -m pytest -q -x "$f" "$@" 2>&1 | tee -a "$OUT/tests.log" | tail -5
  done
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m gemma_batch bench --shape 4b --batch 1,32 --prompt-len 128 --gen-len 128 --backend vulkan --json "$OUT/bench-4b.json" 2>&1 | tail -8
fi
if [[ $what == profile ]]; then
  python3 benchmarks/decode_profile.py "$@" 2>&1 | tail -30
fi
