#version 450
// After the fused QKV projection qkv [T, (nh + 2 nkv) * hd]: per token and head,
//   q heads: RMSNorm over hd with (1 + q_norm), RoPE, written to q [T, nh, hd];
//   k heads: RMSNorm with (1 + k_norm), RoPE, written into the layer's K page at the token's slot;
//   v heads: written raw into the V page.
// RoPE is rotate-half with angle = fp32(position * inv_freq[i]) (inv_freq from the host, the
// same fp32 values the CPU reference uses) and a range-reduced sin/cos.
// Variants: KV_F16 (pages hold fp16 pairs in 32-bit words) | KV_F32.
#include "common.glsl"
#define WG 128
#define HD_MAX 256
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer QKVb { float qkv[]; };
layout(std430, binding = 1) writeonly buffer Qb { float q[]; };
layout(std430, binding = 2) readonly buffer Pb { int positions[]; };
layout(std430, binding = 3) readonly buffer Nb { float norm_w[]; };  // q_norm [hd] then k_norm [hd]
layout(std430, binding = 4) readonly buffer Fb { float inv_freq[]; };  // [hd / 2]
layout(std430, binding = 5) readonly buffer Sb { int slots[]; };
#ifdef KV_F16
layout(std430, binding = 6) writeonly buffer Kb { uint kpage[]; };
layout(std430, binding = 8) writeonly buffer Vb { uint vpage[]; };
#else
layout(std430, binding = 6) writeonly buffer Kb { float kpage[]; };
layout(std430, binding = 8) writeonly buffer Vb { float vpage[]; };
#endif

layout(push_constant) uniform Push {
    uint num_heads;
    uint num_kv_heads;
    uint head_dim;
    float eps;
} pc;

shared float vals[HD_MAX];
shared float red[WG];

void main() {
    uint heads = pc.num_heads + 2 * pc.num_kv_heads;
    uint id = linear_group();
    uint t = id / heads, h = id % heads;
    if (t >= meta.num_tokens) return;
    uint tid = gl_LocalInvocationID.x;
    uint hd = pc.head_dim, half_hd = hd / 2;
    uint base = (t * heads + h) * hd;
    bool is_v = h >= pc.num_heads + pc.num_kv_heads;

    for (uint d = tid; d < hd; d += WG) vals[d] = qkv[base + d];
    barrier();
    if (!is_v) {
        float s = 0.0;
        for (uint d = tid; d < hd; d += WG) s += vals[d] * vals[d];
        red[tid] = s;
        barrier();
        for (uint half_ = WG / 2; half_ > 0; half_ >>= 1) {
            if (tid < half_) red[tid] += red[tid + half_];
            barrier();
        }
        float denom = sqrt(red[0] / float(hd) + pc.eps);
        uint wofs = h < pc.num_heads ? 0u : hd;
        float pos = float(positions[t]);
        float a = 0.0, b = 0.0;
        vec2 sc = vec2(0.0);
        bool mine = tid < half_hd;
        if (mine) {
            a = vals[tid] / denom * (1.0 + norm_w[wofs + tid]);
            b = vals[tid + half_hd] / denom * (1.0 + norm_w[wofs + tid + half_hd]);
            sc = sincos_reduced(pos * inv_freq[tid]);
        }
        barrier();
        if (mine) {
            vals[tid] = a * sc.y - b * sc.x;  // x[d] cos - x[d + half] sin
            vals[tid + half_hd] = b * sc.y + a * sc.x;  // x[d + half] cos + x[d] sin
        }
        barrier();
    }
    if (h < pc.num_heads) {
        for (uint d = tid; d < hd; d += WG) q[(t * pc.num_heads + h) * hd + d] = vals[d];
        return;
    }
    uint kv = is_v ? h - pc.num_heads - pc.num_kv_heads : h - pc.num_heads;
    uint dst = (uint(slots[t]) * pc.num_kv_heads + kv) * hd;
#ifdef KV_F16
    for (uint d = 2 * tid; d < hd; d += 2 * WG) {
        uint word = packHalf2x16(vec2(vals[d], vals[d + 1]));
        if (is_v) vpage[(dst + d) / 2] = word; else kpage[(dst + d) / 2] = word;
    }
#else
    for (uint d = tid; d < hd; d += WG) {
        if (is_v) vpage[dst + d] = vals[d]; else kpage[dst + d] = vals[d];
    }
#endif
}
