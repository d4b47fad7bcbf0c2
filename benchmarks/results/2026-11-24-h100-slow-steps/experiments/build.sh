#!/bin/bash
# The SPIR-V of this folder's experiments, from the tree at 54be5ab (run from anywhere; needs
# glslc and the virtualenv's glslang and SPIR-V tools, as shaders/build.py does):
#   nt_*        the decode matmul's weight-tile loads marked Nontemporal (interaction.py)
#   vahead_*    attention.comp with vahead.diff, V_AHEAD defined (vahead.py)
#   twobuf_*    matmul_coop_direct.comp with xbuffers.diff (xbuffers.py, stats_builds.py)
#   before_*    the decode matmul as committed at 54be5ab (xbuffers.py)
#   ks2_*       matmul_coop_direct.comp with ks2.diff: 2 k blocks a stage (ks2.py)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
BIN=$ROOT/.venv/bin
SPV=$ROOT/gemma_batch/backends/vulkan/spv
TMP=$(mktemp -d)
cd "$HERE"
for name in coop_t16 coop_gated_t16 coop_rows_t16; do
  git -C "$ROOT" show 54be5ab:gemma_batch/backends/vulkan/spv/$name.spv > before_$name.spv
  $BIN/spirv-dis before_$name.spv -o $TMP/$name.spvasm
  sed -E 's/(OpCooperativeMatrixLoadKHR %[0-9]+ %[0-9]+ %int_0 %uint_2) None/\1 Nontemporal/' $TMP/$name.spvasm > $TMP/nt.spvasm
  $BIN/spirv-as --target-env vulkan1.2 $TMP/nt.spvasm -o nt_$name.spv
  $BIN/spirv-val --target-env vulkan1.2 nt_$name.spv
done
cp "$ROOT"/shaders/*.glsl "$ROOT"/shaders/*.comp $TMP/
git -C "$ROOT" show 54be5ab:shaders/attention.comp > $TMP/attention.comp
git -C "$ROOT" show 54be5ab:shaders/matmul_coop_direct.comp > $TMP/matmul_coop_direct.comp
patch -s $TMP/attention.comp vahead.diff
cp $TMP/matmul_coop_direct.comp $TMP/ks2.comp
patch -s $TMP/matmul_coop_direct.comp xbuffers.diff
patch -s $TMP/ks2.comp ks2.diff
for v in "attention_float16:-DKV_F16" "attention_float16_split:-DKV_F16 -DSPLIT_OUT" \
         "attention_float16_split_qk:-DKV_F16 -DSPLIT_OUT -DQK_IN"; do
  glslc -fshader-stage=compute --target-env=vulkan1.1 -O -I$TMP ${v#*:} -DV_AHEAD $TMP/attention.comp -o vahead_${v%%:*}.spv
done
for v in "coop_t16:" "coop_gated_t16:-DGATED" "coop_rows_t16:-DROWS"; do
  $BIN/glslang -I$TMP -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" \
    ${v#*:} $TMP/matmul_coop_direct.comp -o twobuf_${v%%:*}.spv >/dev/null
  $BIN/glslang -I$TMP -V --target-env vulkan1.2 -S comp "-P#extension GL_GOOGLE_include_directive : require" \
    ${v#*:} $TMP/ks2.comp -o ks2_${v%%:*}.spv >/dev/null
done
rm -r $TMP
ls *.spv
