#version 450
// The input of a cooperative-matrix matmul (matmul_coop.comp): row m of x, RMS-normalised with
// (1 + g) with NORM, as two fp16 rows hi and lo and a scale (split.glsl).
//
// A workgroup per row. Variants: NORM (the sum of squares in a fixed order: per invocation
// along K, then subgroupAdd, then the subgroups in index order), ROW_GATHER (row m is
// x[rows[m]] and the rows are meta.num_rows, for the LM head).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "split.glsl"
#include "workgroup.glsl"

#define WG 256
layout(local_size_x = WG) in;

layout(std430, binding = 1) readonly buffer Xb { vec2 x2[]; };
layout(std430, binding = 2) writeonly buffer Ob { uint out_words[]; };
layout(std430, binding = 3) readonly buffer Gb { vec2 g2[]; };
layout(std430, binding = 4) writeonly buffer Sb { float scale[]; };
layout(std430, binding = 5) readonly buffer Rb { int rows[]; };
layout(push_constant) uniform Push {
    uint K;
    float eps;
} pc;

void main() {
    uint m = linear_group(), tid = gl_LocalInvocationID.x;
#ifdef ROW_GATHER
    if (m >= meta.num_rows) return;
    uint src = uint(rows[m]);
#else
    if (m >= meta.num_tokens) return;
    uint src = m;
#endif
    uint K2 = pc.K / 2;
    float ss = 0.0, mx = 0.0;
    for (uint k = tid; k < K2; k += WG) {
        vec2 v = x2[src * K2 + k];
#ifdef NORM
        ss += dot(v, v);
        v *= 1.0 + g2[k];
#endif
        mx = max(mx, max(abs(v.x), abs(v.y)));
    }
    float inv = 1.0;
#ifdef NORM
    inv = 1.0 / sqrt(workgroup_sum(ss) / float(pc.K) + pc.eps);
#endif
    mx = workgroup_max(mx) * inv;
    float s = split_scale(mx);
    for (uint k = tid; k < K2; k += WG) {
        vec2 v = x2[src * K2 + k];
#ifdef NORM
        v = v * (1.0 + g2[k]) * inv;
#endif
        uvec2 words = split_words(v * s);
        out_words[m * pc.K + k] = words.x;
        out_words[m * pc.K + K2 + k] = words.y;
    }
    if (tid == 0) scale[m] = 1.0 / s;
}
