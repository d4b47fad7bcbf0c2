#!/bin/bash
cd "$(dirname "$0")"; mkdir -p spv
SH=../../../../shaders
G=${GLSLANG:-glslang}
build() { label=$1; shift
  for g in plain gated; do
    extra=(); [[ $g == gated ]] && extra=(-DGATED)
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I$SH "${extra[@]}" "$@" matmul_coop_exp.comp -o spv/${label}_$g.spv >/dev/null || echo FAIL $label $g
  done
}
build wide      -DW_T16 -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=4
build wide_g8   -DW_T16 -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=4 -DFOLD_GROUP=8
build i8base    -DW_I8 -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2
build i8base_g8 -DW_I8 -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2 -DFOLD_GROUP=8
