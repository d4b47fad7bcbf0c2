#version 450
// y[m, n] = sum_k x[m, k] * W[n, k] for the M rows of the step and the N rows of W [N, K].
//
// Variants (defines):
//   W_BF16 | W_F16 | W_F32  storage type of W (K must be a multiple of 8)
//   NORM_IN                 x is RMS-normalised on the fly with (1 + g): y = inv_rms[m] * sum_k x*(1+g)*W,
//                           the sum of squares is accumulated in the same pass over x
//   GATED                   two weights (gate: binding 0, up: binding 4): y = gelu_tanh(x.Wg) * (x.Wu)
//   ROW_GATHER              row m of x is x[rows[m]] and M = meta.num_rows (the LM head)
//   EPI_NORM_ADD            then x_res[m, :] += rms_norm(y[m, :]) * (1 + g_epi): Gemma's post-norm and
//                           residual add (o-projection, down-projection)
//   EPI_QK_ROPE             y is the fused [q | k | v] projection; then per head: QK-norm (1 + w) and
//                           RoPE on q and k heads, q written to q_out, k and v into the layer's KV pages
//                           at the tokens' slots (with KV_F16: fp16 pairs in 32-bit words, or KV_F32)
//
// The epilogues need whole rows (EPI_NORM_ADD) or whole heads (EPI_QK_ROPE) of y, which several
// workgroups compute. Each workgroup writes its tile of y, then counts itself done on the
// segment's counter; the last one to finish runs the epilogue for the segment and resets the
// counter (so the counters are zero between dispatches). Which workgroup is last does not change
// the result: it reads the same y and reduces it in a fixed order.
//
// Work split: a workgroup owns MT rows x NT outputs; its WG threads stride over K in pieces of 8.
// Each output's sum is accumulated in the same order whatever M and wherever the row sits in
// the batch (thread-wise along K, then subgroupAdd, then subgroups in index order): batch-invariant.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

#define WG 128
#define NT 4
#define MT 8
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Wb { uvec4 w4[]; };
layout(std430, binding = 1) readonly buffer Xb { vec4 x4[]; };
#if defined(EPI_NORM_ADD) || defined(EPI_QK_ROPE)
#define EPILOGUE
layout(std430, binding = 2) coherent buffer Yb { float y[]; };
layout(std430, binding = 6) coherent buffer Cb { uint counters[]; };
layout(std430, binding = 9) readonly buffer Eb { float g_epi[]; };  // post-norm [N] | q_norm, k_norm [2 hd]
#else
layout(std430, binding = 2) writeonly buffer Yb { float y[]; };
#endif
layout(std430, binding = 3) readonly buffer Gb { float g[]; };
layout(std430, binding = 4) readonly buffer W2b { uvec4 u4[]; };
layout(std430, binding = 5) readonly buffer Rb { int rows[]; };
layout(push_constant) uniform Push {
    uint N;
    uint K;
    float eps;
    uint num_heads;     // EPI_QK_ROPE: q heads, kv heads and head size of y's columns
    uint num_kv_heads;
    uint head_dim;
} pc;

// 8 consecutive weights of row n from k8*8, as two vec4.
#if defined(W_F32)
#define LOAD8(buf, n, k8, lo, hi) { uint i_ = ((n) * (pc.K / 4)) + 2u * (k8); lo = uintBitsToFloat(buf[i_]); hi = uintBitsToFloat(buf[i_ + 1u]); }
#elif defined(W_F16)
#define LOAD8(buf, n, k8, lo, hi) { uvec4 v_ = buf[(n) * (pc.K / 8) + (k8)]; \
    lo = vec4(unpackHalf2x16(v_.x), unpackHalf2x16(v_.y)); hi = vec4(unpackHalf2x16(v_.z), unpackHalf2x16(v_.w)); }
#else
#define LOAD8(buf, n, k8, lo, hi) { uvec4 v_ = buf[(n) * (pc.K / 8) + (k8)]; \
    lo = vec4(bf16_lo(v_.x), bf16_hi(v_.x), bf16_lo(v_.y), bf16_hi(v_.y)); \
    hi = vec4(bf16_lo(v_.z), bf16_hi(v_.z), bf16_lo(v_.w), bf16_hi(v_.w)); }
#endif

#ifdef GATED
#define NACC 2
#else
#define NACC 1
#endif
#ifdef NORM_IN
#define NSS 1
#else
#define NSS 0
#endif
#define SLOTS (NACC * MT * NT + NSS * MT)
shared float partial[WG / 4][SLOTS];  // per subgroup (subgroups have at least 4 lanes)

#include "matmul_epilogue.glsl"

void main() {
#ifdef ROW_GATHER
    uint M = meta.num_rows;
#else
    uint M = meta.num_tokens;
#endif
    uint m_tiles = (M + MT - 1) / MT;
    uint n_tiles = (pc.N + NT - 1) / NT;
    uint id = linear_group();
    if (id >= m_tiles * n_tiles) return;
    uint m0 = (id % m_tiles) * MT;  // neighbouring workgroups share W rows: they stay in cache
    uint n0 = (id / m_tiles) * NT;
    uint tid = gl_LocalInvocationID.x;
    uint K8 = pc.K / 8;

    uint xrow[MT];
    for (uint m = 0; m < MT; m++) {
        uint mm = min(m0 + m, M - 1);
#ifdef ROW_GATHER
        xrow[m] = uint(rows[mm]);
#else
        xrow[m] = mm;
#endif
    }
    uint nrow[NT];
    for (uint n = 0; n < NT; n++) nrow[n] = min(n0 + n, pc.N - 1);

    float acc[MT][NT];
#ifdef GATED
    float acc2[MT][NT];
#endif
#ifdef NORM_IN
    float ss[MT];
#endif
    for (uint m = 0; m < MT; m++) {
        for (uint n = 0; n < NT; n++) {
            acc[m][n] = 0.0;
#ifdef GATED
            acc2[m][n] = 0.0;
#endif
        }
#ifdef NORM_IN
        ss[m] = 0.0;
#endif
    }

    for (uint k8 = tid; k8 < K8; k8 += WG) {
        vec4 wlo[NT], whi[NT];
        for (uint n = 0; n < NT; n++) LOAD8(w4, nrow[n], k8, wlo[n], whi[n]);
#ifdef GATED
        vec4 ulo[NT], uhi[NT];
        for (uint n = 0; n < NT; n++) LOAD8(u4, nrow[n], k8, ulo[n], uhi[n]);
#endif
#ifdef NORM_IN
        vec4 glo = 1.0 + vec4(g[k8 * 8], g[k8 * 8 + 1], g[k8 * 8 + 2], g[k8 * 8 + 3]);
        vec4 ghi = 1.0 + vec4(g[k8 * 8 + 4], g[k8 * 8 + 5], g[k8 * 8 + 6], g[k8 * 8 + 7]);
#endif
        for (uint m = 0; m < MT; m++) {
            vec4 xlo = x4[xrow[m] * (pc.K / 4) + 2 * k8];
            vec4 xhi = x4[xrow[m] * (pc.K / 4) + 2 * k8 + 1];
#ifdef NORM_IN
            ss[m] += dot(xlo, xlo) + dot(xhi, xhi);
            xlo *= glo;
            xhi *= ghi;
#endif
            for (uint n = 0; n < NT; n++) {
                acc[m][n] += dot(xlo, wlo[n]) + dot(xhi, whi[n]);
#ifdef GATED
                acc2[m][n] += dot(xlo, ulo[n]) + dot(xhi, uhi[n]);
#endif
            }
        }
    }

    // Sum over the workgroup: subgroupAdd, then the subgroups' partial sums in index order.
    for (uint m = 0; m < MT; m++) {
        for (uint n = 0; n < NT; n++) {
            float s = subgroupAdd(acc[m][n]);
            if (subgroupElect()) partial[gl_SubgroupID][m * NT + n] = s;
#ifdef GATED
            float s2 = subgroupAdd(acc2[m][n]);
            if (subgroupElect()) partial[gl_SubgroupID][MT * NT + m * NT + n] = s2;
#endif
        }
#ifdef NORM_IN
        float q = subgroupAdd(ss[m]);
        if (subgroupElect()) partial[gl_SubgroupID][NACC * MT * NT + m] = q;
#endif
    }
    barrier();
    if (tid < MT * NT) {
        uint m = tid / NT, n = tid % NT;
        if (m0 + m < M && n0 + n < pc.N) {
            float total = 0.0;
            for (uint j = 0; j < gl_NumSubgroups; j++) total += partial[j][tid];
#ifdef NORM_IN
            float sq = 0.0;
            for (uint j = 0; j < gl_NumSubgroups; j++) sq += partial[j][NACC * MT * NT + m];
            float inv = 1.0 / sqrt(sq / float(pc.K) + pc.eps);
            total *= inv;
#endif
#ifdef GATED
            float up = 0.0;
            for (uint j = 0; j < gl_NumSubgroups; j++) up += partial[j][MT * NT + tid];
#ifdef NORM_IN
            up *= inv;
#endif
            total = gelu_tanh(total) * up;
#endif
            y[(m0 + m) * pc.N + n0 + n] = total;
        }
    }
#ifdef EPILOGUE
#ifdef EPI_QK_ROPE
    uint segment = n0 / pc.head_dim, tiles = pc.head_dim / NT;  // the host checks hd % NT == 0
    uint counter = (m0 / MT) * (pc.num_heads + 2 * pc.num_kv_heads) + segment;
#else
    uint segment = 0, tiles = n_tiles, counter = m0 / MT;
#endif
    memoryBarrierBuffer();  // this workgroup's y is visible before it counts itself done
    barrier();
    if (tid == 0) last_of_segment = atomicAdd(counters[counter], 1u) == tiles - 1u;
    barrier();
    if (!last_of_segment) return;
    memoryBarrierBuffer();
    epilogue(m0, M, segment);
    if (tid == 0) counters[counter] = 0u;
#endif
}
