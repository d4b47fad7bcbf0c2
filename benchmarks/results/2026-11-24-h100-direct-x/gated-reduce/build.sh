#!/bin/bash
set -e
cd "$(git rev-parse --show-toplevel)"
while read label defs; do
  [ -z "$label" ] && continue
  glslc -fshader-stage=compute --target-env=vulkan1.1 -O -Ishaders -DGATED -DSPLIT_NEXT $(for x in $defs; do echo -D$x; done) .exp/gl/reduce.comp -o .exp/gl/${label}.spv
done <<'V'
base
gl4 GLD LR_N=4
gl6 GLD LR_N=6
gl3 GLD LR_N=3
V
