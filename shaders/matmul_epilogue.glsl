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

// vec4 of a row per invocation: rows of up to EPI_VEC * 4 * WG values. Specialization constant 2,
// set by kernels.Kernels from the model's hidden size (at most kernels.EPILOGUE_VEC4), so that
// the registers held are the row's (matmul.comp, which runs this, holds them too).
layout(constant_id = 2) const uint EPI_VEC = 12;

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
#define HD_MAX 256
shared float vals[HD_MAX];

// Head `h` of the tile's rows: q and k heads RMS-normalised with (1 + q_norm / k_norm) and rotated
// (rotate-half RoPE, angle fp32(position * inv_freq[i]), range-reduced sin/cos); q heads go to
// q_out [T, nh, hd], k and v heads into the pages at slots[t] (kv_pages.glsl), rounded as
// kv_formats.py says (KV_I8: the scale from the head's max |x|, a workgroup_max).
void epilogue(uint m0, uint M, uint h) {
    uint tid = gl_LocalInvocationID.x;
    uint hd = pc.head_dim, half_hd = hd / 2;
    bool is_q = h < pc.num_heads, is_v = h >= pc.num_heads + pc.num_kv_heads;
    for (uint t = m0; t < min(m0 + MT, M); t++) {
        for (uint d = tid; d < hd; d += WG) vals[d] = y[t * pc.N + h * hd + d];
        barrier();
        if (!is_v) {
            float s = 0.0;
            for (uint d = tid; d < hd; d += WG) s += vals[d] * vals[d];
            float denom = sqrt(workgroup_sum(s) / float(hd) + pc.eps);
            uint wofs = is_q ? 0u : hd;
            float a = 0.0, b = 0.0;
            vec2 sc = vec2(0.0);
            if (tid < half_hd) {
                a = vals[tid] / denom * (1.0 + g_epi[wofs + tid]);
                b = vals[tid + half_hd] / denom * (1.0 + g_epi[wofs + tid + half_hd]);
                sc = sincos_reduced(float(positions[t]) * inv_freq[tid]);
            }
            barrier();
            if (tid < half_hd) {
                vals[tid] = a * sc.y - b * sc.x;            // x[d] cos - x[d + half] sin
                vals[tid + half_hd] = b * sc.y + a * sc.x;  // x[d + half] cos + x[d] sin
            }
            barrier();
        }
        if (is_q) {
            for (uint d = tid; d < hd; d += WG) q_out[(t * pc.num_heads + h) * hd + d] = vals[d];
        } else {
            uint kv = is_v ? h - pc.num_heads - pc.num_kv_heads : h - pc.num_heads;
            uint row = uint(slots[t]) * pc.num_kv_heads + kv;
#define STORE(at, value) { if (is_v) vpage[at] = value; else kpage[at] = value; }
#if defined(KV_F16) || defined(KV_BF16)
            for (uint d = 2 * tid; d < hd; d += 2 * WG) {
                vec2 pair = vec2(vals[d], vals[d + 1]);
#ifdef KV_F16
                STORE((row * hd + d) / 2, packHalf2x16(clamp(pair, -65504.0, 65504.0)));
#else
                STORE((row * hd + d) / 2, pack_bf16x2(pair));
#endif
            }
#elif defined(KV_I8)
            float mx = 0.0;
            for (uint d = tid; d < hd; d += WG) mx = max(mx, abs(vals[d]));
            float s = int8_scale(workgroup_max(mx));
            uint at = row * kv_i8_row_words(hd);
            for (uint d = 4 * tid; d < hd; d += 4 * WG) {
                STORE(at + d / 4, pack_int8x4(vec4(vals[d], vals[d + 1], vals[d + 2], vals[d + 3]), s));
            }
            if (tid == 0) STORE(at + hd / 4, floatBitsToUint(s));
#else
            for (uint d = tid; d < hd; d += WG) STORE(row * hd + d, vals[d]);
#endif
#undef STORE
        }
        barrier();  // vals is reused by the next row
    }
}
#endif
