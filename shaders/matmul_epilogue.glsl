// The epilogues of matmul.comp (EPI_NORM_ADD, EPI_QK_ROPE), run by the last workgroup of each
// segment (and by reduce.comp); included after matmul.comp's buffers (g_epi at binding 9), push
// constants and tile sizes, and workgroup.glsl. EPI_NORM_ADD's N is a multiple of 4.

#ifdef EPI_QK_ROPE
layout(std430, binding = 10) writeonly buffer Qb { float q_out[]; };
layout(std430, binding = 11) readonly buffer Pb { int positions[]; };
layout(std430, binding = 12) readonly buffer Fb { float inv_freq[]; };  // [hd / 2]
layout(std430, binding = 13) readonly buffer Sb { int slots[]; };
#include "kv_pages.glsl"
#ifdef KV_F32
layout(std430, binding = 14) writeonly buffer Kb { float kpage[]; };
layout(std430, binding = 15) writeonly buffer Vb { float vpage[]; };
#else
layout(std430, binding = 14) writeonly buffer Kb { uint kpage[]; };  // KV_F16 | KV_BF16 | KV_I8: 32-bit words
layout(std430, binding = 15) writeonly buffer Vb { uint vpage[]; };
#endif
#endif


#ifdef EPILOGUE
shared bool last_of_segment;
#endif

#ifdef EPI_NORM_ADD
layout(std430, binding = 10) buffer XRb { vec4 x_res4[]; };
layout(std430, binding = 9) readonly buffer Eb4 { vec4 g_epi4[]; };  // the includer's g_epi, 16 bytes at a time

// vec4 of a row per invocation: rows of up to EPI_VEC * 4 * WG values. Specialization constant 2
// (reduce.comp's post-norm: 4, with its own workgroup size), set by kernels.Kernels from the
// model's hidden size, so that the registers held are the row's (matmul.comp, which runs this,
// holds them too; at most variants.EPILOGUE_VEC4 there).
#ifndef EPI_VEC_ID
#define EPI_VEC_ID 2
#endif
layout(constant_id = EPI_VEC_ID) const uint EPI_VEC = 12;

// x_res[t] += v / rms(v) * (1 + g_epi) for row t, given as this invocation's vec4 v[i] of
// elements 4 (i WG + tid) ... (zero past N). v becomes the new x_res row (zero past N). The loads
// of x_res and g_epi are issued before the sum's barriers.
void post_norm_add(uint t, inout vec4 v[EPI_VEC]) {
    uint tid = gl_LocalInvocationID.x, row4 = t * pc.N / 4;
    float s = 0.0;
    [[unroll]] for (uint i = 0; i < EPI_VEC; i++) s += dot(v[i], v[i]);
    vec4 xr[EPI_VEC], g[EPI_VEC];
    [[unroll]] for (uint i = 0; i < EPI_VEC; i++) {
        uint n4 = i * WG + tid;
        xr[i] = 4 * n4 < pc.N ? x_res4[row4 + n4] : vec4(0.0);
        g[i] = 4 * n4 < pc.N ? g_epi4[n4] : vec4(0.0);
    }
    float denom = sqrt(workgroup_sum(s) / float(pc.N) + pc.eps);
    [[unroll]] for (uint i = 0; i < EPI_VEC; i++) {
        uint n4 = i * WG + tid;
        if (4 * n4 < pc.N) {
            v[i] = xr[i] + v[i] / denom * (1.0 + g[i]);
            x_res4[row4 + n4] = v[i];
        }
    }
}

void epilogue(uint m0, uint M, uint segment) {
    uint tid = gl_LocalInvocationID.x;
    for (uint t = m0; t < min(m0 + MT, M); t++) {
        vec4 v[EPI_VEC];
        [[unroll]] for (uint i = 0; i < EPI_VEC; i++) {
            uint n = 4 * (i * WG + tid), at = t * pc.N + n;
            v[i] = n < pc.N ? vec4(y[at], y[at + 1], y[at + 2], y[at + 3]) : vec4(0.0);
        }
        post_norm_add(t, v);
    }
}
#endif

#ifdef EPI_QK_ROPE
#include "qk_rope.glsl"

// Head `h` of row t, its values in vals[0, hd) (qk_rope.glsl): a q head to q_out [T, nh, hd], a k
// or v head into the pages at slots[t].
void head_out(uint t, uint h) {
    uint tid = gl_LocalInvocationID.x, hd = pc.head_dim;
    bool is_q = h < pc.num_heads, is_v = h >= pc.num_heads + pc.num_kv_heads;
    if (!is_v) norm_rope(hd, is_q ? 0u : hd, pc.eps, positions[t]);
    if (is_q) {
        for (uint d = tid; d < hd; d += WG) q_out[(t * pc.num_heads + h) * hd + d] = vals[d];
    } else {
        uint kv = is_v ? h - pc.num_heads - pc.num_kv_heads : h - pc.num_heads;
        store_page_row(uint(slots[t]) * pc.num_kv_heads + kv, hd, is_v, 0u);
    }
}

// Head `h` of the tile's rows of y.
void epilogue(uint m0, uint M, uint h) {
    uint tid = gl_LocalInvocationID.x, hd = pc.head_dim;
    for (uint t = m0; t < min(m0 + MT, M); t++) {
        for (uint d = tid; d < hd; d += WG) vals[d] = y[t * pc.N + h * hd + d];
        barrier();
        head_out(t, h);
        barrier();  // vals is reused by the next row
    }
}
#endif
