#!/bin/bash
# builds .exp/pf/<label>_<kind>.spv: matmul_coop.comp's fp16-tile prefill tile (64 outputs x 128 rows) in other subgroup layouts
set -e
cd $(git rev-parse --show-toplevel)
G=.venv/bin/glslang
while read label defs; do
  [ -z "$label" ] && continue
  for kind in "t16_fold:" "gated_t16_fold:GATED"; do
    k=${kind%%:*}; d=${kind#*:}
    $G -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -Ishaders -DW_T16 $( [ -n "$d" ] && echo -D$d ) $(for x in $defs; do echo -D$x; done) ${SRC:-shaders/matmul_coop.comp} -o .exp/pf/${label}_$k.spv >/dev/null
  done
done <<'V'
base SG_N=2 SG_M=4 TN=2 TM=2
n1m4t4x2 SG_N=1 SG_M=4 TN=4 TM=2
n2m2t2x4 SG_N=2 SG_M=2 TN=2 TM=4
n4m2t1x4 SG_N=4 SG_M=2 TN=1 TM=4
n4m4t1x2 SG_N=4 SG_M=4 TN=1 TM=2
n2m8t2x1 SG_N=2 SG_M=8 TN=2 TM=1
n1m8t4x1 SG_N=1 SG_M=8 TN=4 TM=1
V
ls .exp/pf/*.spv | wc -l
