#!/bin/bash
# name defines... : reduce_gated_split builds
set -e
cd "$(dirname "$0")/../.."
while read name defs; do
  [ -z "$name" ] && continue
  glslc -fshader-stage=compute --target-env=vulkan1.1 -O -Ishaders -DGATED -DSPLIT_NEXT $(for d in $defs; do echo -D$d; done) .exp/gr/reduce.comp -o .exp/gr/$name.spv
done <<'V'
ship0
w512 PIECE_ROWS=0
w1024 WG=1024 ACT_VEC=6 PIECE_ROWS=0
w1024p WG=1024 ACT_VEC=6
w256 WG=256 ACT_VEC=24 PIECE_ROWS=0
V
cmp .exp/gr/ship0.spv gemma_batch/backends/vulkan/spv/reduce_gated_split.spv && echo "ship0 == shipped"
ls -la .exp/gr/*.spv
glslc -fshader-stage=compute --target-env=vulkan1.1 -O -Ishaders -DEPI_NORM_ADD -DSPLIT_NEXT .exp/gr/reduce.comp -o .exp/gr/pn_ship0.spv
cmp .exp/gr/pn_ship0.spv gemma_batch/backends/vulkan/spv/reduce_post_norm_split.spv && echo "pn_ship0 == shipped"
glslc -fshader-stage=compute --target-env=vulkan1.1 -O -Ishaders -DEPI_NORM_ADD -DSPLIT_NEXT -DPN_ONE=640 .exp/gr/reduce.comp -o .exp/gr/pn640.spv
