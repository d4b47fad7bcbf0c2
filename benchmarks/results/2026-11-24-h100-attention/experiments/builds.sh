#!/bin/bash
# The experimental builds, from the repository root with the experiment's files in .exp/attnx/:
# attention.comp (shaders/attention.comp + attention-variants.diff) as attn_<name>.spv, KV_F16 and
# SPLIT_OUT plus each name's defines; direct_wfirst.comp (shaders/matmul_coop_direct.comp +
# matmul-weights-before-header.diff) as wf_<variant>.spv.
set -e
while read name defs; do
  [ -z "$name" ] && continue
  glslc -fshader-stage=compute --target-env=vulkan1.1 -O -Ishaders -DKV_F16 -DSPLIT_OUT $(for d in $defs; do echo -D$d; done) \
    .exp/attnx/attention.comp -o .exp/attnx/attn_$name.spv
done <<'V'
base
empty EXP_EMPTY
nomerge EXP_NOMERGE
nosplit EXP_NOSPLIT
nm_noV EXP_NOMERGE EXP_NOV
nm_noS EXP_NOMERGE EXP_NOS
nm_noSV EXP_NOMERGE EXP_NOS EXP_NOV
nm_noQSV EXP_NOMERGE EXP_NOS EXP_NOV EXP_NOQ
nm_pass EXP_NOMERGE OPT_PASS
pass OPT_PASS
merge OPT_MERGE
token OPT_TOKEN
passmerge OPT_PASS OPT_MERGE
passtoken OPT_PASS OPT_TOKEN
wg256 WG=256
wg256pass WG=256 OPT_PASS
vk16 VK=16
V
for v in "coop_t16:" "coop_gated_t16:GATED" "coop_rows_t16:ROWS"; do
  name=${v%%:*}; def=${v#*:}
  glslang -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" -Ishaders ${def:+-D$def} \
    .exp/attnx/direct_wfirst.comp -o .exp/attnx/wf_$name.spv
done
