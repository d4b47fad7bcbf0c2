#!/bin/bash
# build.sh: the decode matmul variants of tsweep.py (3-, 4-*.txt), as <label>_{plain,gated}.spv here.
# mm.comp is shaders/matmul_coop_direct.comp with mm.diff applied (TM, RING/BLOCK, KS, WONLY, PLAIN_LOADS switches).
cd "$(dirname "$0")"
patch -s -o mm.comp ../../../../shaders/matmul_coop_direct.comp mm.diff
G=${GLSLANG:-glslang}
build() { label=$1; shift
  for g in plain gated; do
    d=""; [[ $g == gated ]] && d=-DGATED
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I../../../../shaders $d "$@" mm.comp -o ${label}_$g.spv >/dev/null || echo FAIL $label $g
  done
}
build base
build tm1 -DTM=1
build tm1r2 -DTM=1 -DRING=2 -DBLOCK
build tm1r3 -DTM=1 -DRING=3 -DBLOCK
build tm1r2i -DTM=1 -DRING=2
build r2 -DRING=2 -DBLOCK
build tm1ks8 -DTM=1 -DKS=8
build tm1r2ks2 -DTM=1 -DRING=2 -DKS=2 -DBLOCK
build tm1r4ks2 -DTM=1 -DRING=4 -DKS=2 -DBLOCK
build wonly -DWONLY
build plainld -DPLAIN_LOADS
build tm1wonly -DTM=1 -DWONLY
rm mm.comp
