#!/bin/bash
cd "$(dirname "$0")"; mkdir -p spv
SH=../../../../shaders
G=${GLSLANG:-glslang}
build() { label=$1; shift
  for g in plain gated; do
    extra=(); [[ $g == gated ]] && extra=(-DGATED)
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I$SH -DW_T16 "${extra[@]}" "$@" matmul_coop_exp.comp -o spv/${label}_$g.spv >/dev/null || echo FAIL $label $g
  done
}
build base     -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2
for gm in 4 8 16; do
build base_g$gm    -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2 -DFOLD_GROUP=$gm
build n128b_g$gm   -DSG_N=2 -DSG_M=4 -DTN=4 -DTM=2 -DKU=32 -DFOLD_GROUP=$gm
build n256m64_g$gm -DSG_N=4 -DSG_M=2 -DTN=4 -DTM=2 -DKU=32 -DFOLD_GROUP=$gm
done
build n128b    -DSG_N=2 -DSG_M=4 -DTN=4 -DTM=2 -DKU=32
build n256m64  -DSG_N=4 -DSG_M=2 -DTN=4 -DTM=2 -DKU=32
