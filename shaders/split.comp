#version 450
// The input of a cooperative-matrix matmul (matmul_coop.comp): row m of x as two fp16 rows.
//
// v = x[m] (RMS-normalised with (1 + g) with NORM) is scaled by s = 2^e, the power of two
// that puts max |v| in [2^14, 2^15) (fp16 overflows at 65504), then hi = fp16(s v) and
// lo = fp16(s v - hi): hi + lo carries 22 significant bits. scale[m] = 1 / s (exact), which
// reduce.comp applies to the matmul's sums. Output row m: [hi (K) | lo (K)], fp16 pairs in
// 32-bit words, K words per row.
//
// A workgroup per row. Variants: NORM (the sum of squares in a fixed order: per invocation
// along K, then subgroupAdd, then the subgroups in index order), ROW_GATHER (row m is
// x[rows[m]] and the rows are meta.num_rows, for the LM head).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

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

shared float red[WG];

// v rounded to fp16's 11 significant bits (nearest, ties to even) in fp32 by integer arithmetic:
// exact in fp16 for the scaled values (|v| < 2^15). Not unpackHalf2x16(packHalf2x16(v)): NVIDIA's
// compiler (driver 580) folds that round trip to v, which left lo = 0.
vec2 fp16_round(vec2 v) {
    uvec2 u = floatBitsToUint(v);
    return uintBitsToFloat((u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u);
}

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
    ss = subgroupAdd(ss);
    if (subgroupElect()) red[gl_SubgroupID] = ss;
    barrier();
    float total = 0.0;
    for (uint j = 0; j < gl_NumSubgroups; j++) total += red[j];
    inv = 1.0 / sqrt(total / float(pc.K) + pc.eps);
    barrier();
#endif
    mx = subgroupMax(mx);
    if (subgroupElect()) red[gl_SubgroupID] = mx;
    barrier();
    for (uint j = 0; j < gl_NumSubgroups; j++) mx = max(mx, red[j]);
    mx *= inv;
    int e = 0;
    if (mx > 0.0) frexp(mx, e);  // mx < 2^e
    float s = exp2(float(clamp(15 - e, -100, 100)));
    for (uint k = tid; k < K2; k += WG) {
        vec2 v = x2[src * K2 + k];
#ifdef NORM
        v = v * (1.0 + g2[k]) * inv;
#endif
        v *= s;
        vec2 h = fp16_round(v);
        uint hi = packHalf2x16(h);
        uint lo = packHalf2x16(v - h);
        out_words[m * pc.K + k] = hi;
        out_words[m * pc.K + K2 + k] = lo;
    }
    if (tid == 0) scale[m] = 1.0 / s;
}
