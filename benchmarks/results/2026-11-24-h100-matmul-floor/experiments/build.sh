#!/bin/bash
# build.sh label "DEFINES..." : coop_t16 and coop_gated_t16 variants of mm.comp
# (from the repository root: mm.comp is shaders/matmul_coop_direct.comp with mm.diff applied)
cd "$(dirname "$0")"
patch -s -o mm.comp ../../../../shaders/matmul_coop_direct.comp mm.diff
G=${GLSLANG:-glslang}
build() { label=$1; shift
  $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I../../../../shaders "$@" mm.comp -o ${label}_plain.spv >/dev/null || { echo FAIL $label; $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I../../../../shaders "$@" mm.comp -o /dev/null | head; }
  $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I../../../../shaders -DGATED "$@" mm.comp -o ${label}_gated.spv >/dev/null || echo FAIL $label gated
}
# 3-prefetch-depth.txt (and base for all)
build base
build bring1 -DRING=1 -DBLOCK
build bring2 -DRING=2 -DBLOCK
build bring3 -DRING=3 -DBLOCK
build bring2ks2 -DRING=2 -DKS=2 -DBLOCK
build bring3ks2 -DRING=3 -DKS=2 -DBLOCK
build bring4ks2 -DRING=4 -DKS=2 -DBLOCK
build bring3ks8 -DRING=2 -DKS=8 -DBLOCK  # (named 3, built with RING 2)
# 2-variants.txt
build ks8 -DKS=8
build nox -DNOX
build noxks8 -DNOX -DKS=8
build sg8tn1 -DSG_N=8 -DTN=1
build sg2tn4 -DSG_N=2 -DTN=4
build bn64 -DSG_N=4 -DTN=1
build noxbn64 -DNOX -DSG_N=4 -DTN=1
build noxsg2 -DNOX -DSG_N=2 -DTN=2
# 3a-ring-interleaved.txt
build ring1 -DRING=1
build ring2 -DRING=2
build ring3 -DRING=3
build ring2ks2 -DRING=2 -DKS=2
build ring3ks2 -DRING=3 -DKS=2
build ring4ks2 -DRING=4 -DKS=2
rm mm.comp
