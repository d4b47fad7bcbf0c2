#!/bin/bash
# Builds every spv/ file this folder's scripts read (glslc and glslang on PATH; the GPU machine has
# neither, so run it here and carry spv/): codesize.comp's variants, then the patched kernels of
# each diff (build_variants.py, against the tree at the commit before fdff182, 7f38140).
set -e
cd "$(dirname "$0")"
mkdir -p spv
for iters in 8 64 256 640; do
  for seed in 0 1 2 3; do
    glslc -fshader-stage=compute --target-env=vulkan1.2 -O -DSEED=${seed}u -DITERS=$iters -DUNROLL codesize.comp -o spv/unroll_${iters}_${seed}.spv
    glslc -fshader-stage=compute --target-env=vulkan1.2 -O -DSEED=${seed}u -DITERS=$iters codesize.comp -o spv/loop_${iters}_${seed}.spv
  done
done
A=attention_float16_split,attention_float16_split_qk
python build_variants.py rolled.diff $A
python build_variants.py nochunks.diff reduce_gated_split_rows
for r in 64 256; do
  python build_variants.py pad.diff reduce_post_norm_split padu$r PAD_ROUNDS=${r}u,PAD_UNROLL
  python build_variants.py pad.diff reduce_post_norm_split padl$r PAD_ROUNDS=${r}u
done
python build_variants.py pad_attention.diff $A apadu256 PAD_ROUNDS=256u,PAD_UNROLL
python build_variants.py pad_attention.diff $A apadl256 PAD_ROUNDS=256u
python build_variants.py const.diff $A const EXP_CONST,EXP_BS=16u
for knob in NO_SCORES NO_SOFTMAX NO_VALUES NO_SINGLE NO_MERGE; do
  python build_variants.py sizes.diff attention_float16,attention_float16_split_qk sz_$knob EXP_$knob
done
python build_variants.py sizes.diff attention_float16,attention_float16_split_qk sz_full EXP_NONE
python build_variants.py sizes.diff attention_float16,attention_float16_split_qk sz_ALL \
  EXP_NO_SCORES,EXP_NO_SOFTMAX,EXP_NO_VALUES,EXP_NO_SINGLE,EXP_NO_MERGE
python build_variants.py actvec.diff reduce_gated_split_rows actvec3 EXP_ACT_VEC=3
python build_variants.py postnorm_n.diff reduce_post_norm_split postn EXP_N=2560u
