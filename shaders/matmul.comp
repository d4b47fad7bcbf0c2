#version 450
// y[m, n] = sum_k x[m, k] * W[n, k] for the M rows of the step and the N rows of W [N, K].
//
// Variants (defines):
//   W_BF16 | W_F16 | W_F32  storage type of W (K must be a multiple of 8)
//   W_I8 | W_I4 | W_Q4 | W_Q5  quantized W (model/quant.py; backends/vulkan/weights.py: codes,
//                           then scales, in one buffer): int8 codes with an fp16 scale per 32 weights;
//                           int4 codes (two per byte, 0..15) with an fp16 scale and minimum per
//                           pc.group weights; min8 (min8.glsl): int4 / int5 codes with 8-bit
//                           multiples of the row's steps per pc.group. Applied per piece of 8 (a piece
//                           lies in one group): scale * sum(x * code) (+ minimum * sum(x)).
//                           Dequantized in registers only.
//   NORM_IN                 x is RMS-normalised on the fly with (1 + g): y = inv_rms[m] * sum_k x*(1+g)*W,
//                           the sum of squares is accumulated in the same pass over x
//   GATED                   two weights (gate: binding 0, up: binding 4): y = gelu_tanh(x.Wg) * (x.Wu)
//   ROW_GATHER              row m of x is x[rows[m]] and M = meta.num_rows (the LM head)
//   EPI_NORM_ADD            then x_res[m, :] += rms_norm(y[m, :]) * (1 + g_epi): Gemma's post-norm and
//                           residual add (o-projection, down-projection)
//   EPI_QK_ROPE             y is the fused [q | k | v] projection; then per head: QK-norm (1 + w) and
//                           RoPE on q and k heads, q written to q_out, k and v into the layer's KV pages
//                           at the tokens' slots (KV_F16 | KV_BF16 | KV_F32 | KV_I8: kv_pages.glsl)
//
// The epilogues need whole rows (EPI_NORM_ADD) or whole heads (EPI_QK_ROPE) of y, which several
// workgroups compute. Each workgroup writes its tile of y, then counts itself done on the
// segment's counter; the last one to finish runs the epilogue for the segment and resets the
// counter (so the counters are zero between dispatches). Which workgroup is last does not change
// the result: it reads the same y and reduces it in a fixed order.
//
// Work split: a workgroup owns MT rows x NWG outputs. It is TEAMS teams of 32 invocations; KSPLIT
// teams share NT outputs for the MT rows and split K between them: the KSPLIT * 32 lanes stride
// over K in pieces of 8 (lane l takes pieces l, l + 32 KSPLIT, ...), so each lane streams
// 16-byte loads of NT weight rows. NT and KSPLIT are set per variant (variants.MATMUL_KINDS):
// KSPLIT > 1 keeps enough workgroups in flight when N is small (the o- and down-projections). Rows past the
// step's M are skipped (a uniform branch), so a decode step of one row does one row's work.
// Each output's sum has one order whatever M and wherever the row sits in the batch: per lane
// along K, then a butterfly over 32 lanes (subgroups of 32 or more), or over 8 lanes and the
// team's 4 clusters in index order (subgroups of 8 or 16), then the KSPLIT teams in index order:
// batch-invariant.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "workgroup.glsl"
#include "min8.glsl"

#define WG 128
#define TEAM 32
#define TEAMS (WG / TEAM)
#ifndef NT
#define NT 2               // outputs per team
#endif
#ifndef KSPLIT
#define KSPLIT 1           // teams splitting K for the same outputs
#endif
#define NWG (TEAMS / KSPLIT * NT)   // outputs per workgroup (variants.matmul_cols)
#define MT 8               // rows per workgroup (variants.MATMUL_ROWS)
layout(local_size_x = WG) in;

#if defined(W_I8)
layout(std430, binding = 0) readonly buffer Wb { uvec2 w4[]; };      // 8 int8 codes per element
layout(std430, binding = 4) readonly buffer W2b { uvec2 u4[]; };
#elif defined(W_I4) || defined(W_Q4) || defined(W_Q5)
layout(std430, binding = 0) readonly buffer Wb { uint w4[]; };       // 8 int4 codes (or low 4 bits) per element
layout(std430, binding = 4) readonly buffer W2b { uint u4[]; };
#else
layout(std430, binding = 0) readonly buffer Wb { uvec4 w4[]; };
layout(std430, binding = 4) readonly buffer W2b { uvec4 u4[]; };
#endif
// The scales of a quantized W, after its codes in the same buffer (aliases of bindings 0 and 4).
layout(std430, binding = 0) readonly buffer WSb { uint w_scales[]; };
layout(std430, binding = 4) readonly buffer W2Sb { uint u_scales[]; };
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
layout(std430, binding = 5) readonly buffer Rb { int rows[]; };
layout(push_constant) uniform Push {
    uint N;
    uint K;
    float eps;
    uint num_heads;     // EPI_QK_ROPE: q heads, kv heads and head size of y's columns
    uint num_kv_heads;
    uint head_dim;
    uint group;         // W_I4, W_Q4, W_Q5: weights per scale and minimum
} pc;

// 8 consecutive weights of row n from k8*8, as two vec4.
#if defined(W_F32)
#define LOAD8(buf, n, k8, lo, hi) { uint i_ = ((n) * (pc.K / 4)) + 2u * (k8); lo = uintBitsToFloat(buf[i_]); hi = uintBitsToFloat(buf[i_ + 1u]); }
#elif defined(W_F16)
#define LOAD8(buf, n, k8, lo, hi) { uvec4 v_ = buf[(n) * (pc.K / 8) + (k8)]; \
    lo = vec4(unpackHalf2x16(v_.x), unpackHalf2x16(v_.y)); hi = vec4(unpackHalf2x16(v_.z), unpackHalf2x16(v_.w)); }
#elif defined(W_I8)
#define LOAD8(buf, n, k8, lo, hi) { uvec2 v_ = buf[(n) * (pc.K / 8) + (k8)]; lo = int8x4(v_.x); hi = int8x4(v_.y); }
#elif defined(W_I4) || defined(W_Q4) || defined(W_Q5)
#define LOAD8(buf, n, k8, lo, hi) { uint v_ = buf[(n) * (pc.K / 8) + (k8)]; lo = uint4x4(v_); hi = uint4x4(v_ >> 16); }
#else
#define LOAD8(buf, n, k8, lo, hi) { uvec4 v_ = buf[(n) * (pc.K / 8) + (k8)]; \
    lo = vec4(bf16_lo(v_.x), bf16_hi(v_.x), bf16_lo(v_.y), bf16_hi(v_.y)); \
    hi = vec4(bf16_lo(v_.z), bf16_hi(v_.z), bf16_lo(v_.w), bf16_hi(v_.w)); }
#endif
// The (scale, minimum) of the piece k8 of row n: int8's scale per INT8_GROUP (halves after the codes),
// int4's pair per pc.group (a word after the codes); 1 and 0 for float weights.
#if defined(W_I8)
#define SCALE_AT(n, k8) ((n) * (pc.K / INT8_GROUP) + (k8) / (INT8_GROUP / 8))
#define PIECE_SCALE(scales, n, k8, steps) vec2(half_of(scales[pc.N * (pc.K / 4) + SCALE_AT(n, k8) / 2], SCALE_AT(n, k8) & 1u), 0.0)
#elif defined(W_I4)
#define PIECE_SCALE(scales, n, k8, steps) unpackHalf2x16(scales[pc.N * (pc.K / 8) + (n) * (pc.K / pc.group) + (k8) * 8 / pc.group])
#elif defined(W_Q4) || defined(W_Q5)
#define Q_ROW(n) (pc.N * (pc.K / 8) + (n) * Q_SIDE_WORDS(pc.K, pc.group))
#define PIECE_SCALE(scales, n, k8, steps) min8_pair(steps, scales[Q_ROW(n) + Q_PAIR_WORD(pc.K, (k8) * 8u / pc.group)], (k8) * 8u / pc.group)
#define ROW_STEPS(scales, n) unpackHalf2x16(scales[Q_ROW(n)])
#else
#define PIECE_SCALE(scales, n, k8, steps) vec2(1.0, 0.0)
#endif
#ifndef ROW_STEPS
#define ROW_STEPS(scales, n) vec2(0.0)
#endif
#ifdef GATED
#define UP_STEPS(n) ROW_STEPS(u_scales, n)
#else
#define UP_STEPS(n) vec2(0.0)
#endif
// W_Q5: the fifth bits of the piece k8 of row n added to its codes (lo, hi); nothing for the others.
#if defined(W_Q5)
#define HIGH8(scales, n, k8, lo, hi) { uint h_ = scales[Q_ROW(n) + 1u + (k8) / 4u] >> (8u * ((k8) & 3u)); \
    lo += high4(h_); hi += high4(h_ >> 4); }
#else
#define HIGH8(scales, n, k8, lo, hi)
#endif
// A piece's part of a sum: x . w (lo and hi halves) times the scale, plus the minimum times the sum of x (int4, min8).
#if defined(W_I4) || defined(W_Q4) || defined(W_Q5)
#define W_MINIMUM
#define PIECE_SUM(xlo, xhi, wlo, whi, s, xsum) ((s).x * (dot(xlo, wlo) + dot(xhi, whi)) + (s).y * (xsum))
#else
#define PIECE_SUM(xlo, xhi, wlo, whi, s, xsum) ((s).x * (dot(xlo, wlo) + dot(xhi, whi)))
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
#define NV (NACC * MT * NT + NSS * MT)  // sums per team: products, then sums of squares
shared float cluster_sums[WG / 8][NV];   // 8-lane partial sums (subgroups of 8 or 16)
#if KSPLIT > 1
shared float team_sums[TEAMS][NV];
#endif

#include "matmul_epilogue.glsl"

// Sum of v over 2^steps lanes by xor butterfly: every lane of the cluster gets the same total.
float butterfly(float v, uint steps) {
    for (uint i = 0; i < steps; i++) v += subgroupShuffleXor(v, 1u << i);
    return v;
}

void main() {
#ifdef ROW_GATHER
    uint M = meta.num_rows;
#else
    uint M = meta.num_tokens;
#endif
    uint m_tiles = (M + MT - 1) / MT;
    uint n_tiles = (pc.N + NWG - 1) / NWG;
    uint id = linear_group();
    if (id >= m_tiles * n_tiles) return;
    uint m0 = (id % m_tiles) * MT;  // neighbouring workgroups share W rows: they stay in cache
    uint n0 = (id / m_tiles) * NWG;
    uint mcount = min(MT, M - m0);
    uint tid = gl_LocalInvocationID.x, team = tid / TEAM, lane = tid % TEAM;
    uint kgroup = team % KSPLIT, ogroup = team / KSPLIT;
    uint K8 = pc.K / 8;

    uint xrow[MT];
    [[unroll]] for (uint m = 0; m < MT; m++) {
        uint mm = min(m0 + m, M - 1);
#ifdef ROW_GATHER
        xrow[m] = uint(rows[mm]);
#else
        xrow[m] = mm;
#endif
    }
    uint nrow[NT];
    [[unroll]] for (uint n = 0; n < NT; n++) nrow[n] = min(n0 + ogroup * NT + n, pc.N - 1);
    // min8: each row's two steps, read once (the k loop reads a piece's pair alone); 0 for the others.
    vec2 wstep[NT], ustep[NT];
    [[unroll]] for (uint n = 0; n < NT; n++) { wstep[n] = ROW_STEPS(w_scales, nrow[n]); ustep[n] = UP_STEPS(nrow[n]); }

    float sums[NV];
    [[unroll]] for (uint v = 0; v < NV; v++) sums[v] = 0.0;
#define ACC(m, n) sums[(m) * NT + (n)]
#define ACC2(m, n) sums[MT * NT + (m) * NT + (n)]
#define SS(m) sums[NACC * MT * NT + (m)]

    for (uint k8 = kgroup * TEAM + lane; k8 < K8; k8 += KSPLIT * TEAM) {
        vec4 wlo[NT], whi[NT];
        vec2 ws[NT];
        [[unroll]] for (uint n = 0; n < NT; n++) {
            LOAD8(w4, nrow[n], k8, wlo[n], whi[n]);
            HIGH8(w_scales, nrow[n], k8, wlo[n], whi[n]);
            ws[n] = PIECE_SCALE(w_scales, nrow[n], k8, wstep[n]);
        }
#ifdef GATED
        vec4 ulo[NT], uhi[NT];
        vec2 us[NT];
        [[unroll]] for (uint n = 0; n < NT; n++) {
            LOAD8(u4, nrow[n], k8, ulo[n], uhi[n]);
            HIGH8(u_scales, nrow[n], k8, ulo[n], uhi[n]);
            us[n] = PIECE_SCALE(u_scales, nrow[n], k8, ustep[n]);
        }
#endif
#ifdef NORM_IN
        vec4 glo = 1.0 + vec4(g[k8 * 8], g[k8 * 8 + 1], g[k8 * 8 + 2], g[k8 * 8 + 3]);
        vec4 ghi = 1.0 + vec4(g[k8 * 8 + 4], g[k8 * 8 + 5], g[k8 * 8 + 6], g[k8 * 8 + 7]);
#endif
        [[unroll]] for (uint m = 0; m < MT; m++) {
            if (m >= mcount) continue;  // uniform; unrolled, so sums[] stays in registers
            vec4 xlo = x4[xrow[m] * (pc.K / 4) + 2 * k8];
            vec4 xhi = x4[xrow[m] * (pc.K / 4) + 2 * k8 + 1];
#ifdef NORM_IN
            SS(m) += dot(xlo, xlo) + dot(xhi, xhi);
            xlo *= glo;
            xhi *= ghi;
#endif
#ifdef W_MINIMUM
            float xsum = dot(xlo, vec4(1.0)) + dot(xhi, vec4(1.0));
#endif
            [[unroll]] for (uint n = 0; n < NT; n++) {
                ACC(m, n) += PIECE_SUM(xlo, xhi, wlo[n], whi[n], ws[n], xsum);
#ifdef GATED
                ACC2(m, n) += PIECE_SUM(xlo, xhi, ulo[n], uhi[n], us[n], xsum);
#endif
            }
        }
    }

    // Each team's sums over its 32 lanes.
    bool wide = gl_SubgroupSize >= TEAM;
    [[unroll]] for (uint v = 0; v < NV; v++) sums[v] = butterfly(sums[v], wide ? 5u : 3u);
    if (!wide) {
        if (lane % 8 == 0) {
            [[unroll]] for (uint v = 0; v < NV; v++) cluster_sums[tid / 8][v] = sums[v];
        }
        barrier();
        [[unroll]] for (uint v = 0; v < NV; v++) {
            float t = 0.0;
            for (uint c = 0; c < TEAM / 8; c++) t += cluster_sums[team * (TEAM / 8) + c][v];
            sums[v] = t;
        }
    }
#if KSPLIT > 1
    if (lane == 0) {
        [[unroll]] for (uint v = 0; v < NV; v++) team_sums[team][v] = sums[v];
    }
    barrier();
    [[unroll]] for (uint v = 0; v < NV; v++) {
        float t = 0.0;
        for (uint k = 0; k < KSPLIT; k++) t += team_sums[ogroup * KSPLIT + k][v];
        sums[v] = t;
    }
#endif
    // Lane (m * NT + n) of the first team of each output group writes output (m, n).
    [[unroll]] for (uint m = 0; m < MT; m++) {
        [[unroll]] for (uint n = 0; n < NT; n++) {
            uint col = n0 + ogroup * NT + n;
            if (kgroup != 0 || lane != m * NT + n || m >= mcount || col >= pc.N) continue;
            float total = ACC(m, n);
#ifdef NORM_IN
            float inv = 1.0 / sqrt(SS(m) / float(pc.K) + pc.eps);
            total *= inv;
#endif
#ifdef GATED
            float up = ACC2(m, n);
#ifdef NORM_IN
            up *= inv;
#endif
            total = gelu_tanh(total) * up;
#endif
            y[(m0 + m) * pc.N + col] = total;
        }
    }
#ifdef EPILOGUE
#ifdef EPI_QK_ROPE
    uint segment = n0 / pc.head_dim, tiles = pc.head_dim / NWG;  // the host checks hd % NWG == 0
    uint counter = (m0 / MT) * (pc.num_heads + 2 * pc.num_kv_heads) + segment;
#else
    uint segment = 0, tiles = n_tiles, counter = m0 / MT;
#endif
    RETURN_UNLESS_LAST(last_of_segment, counters[counter], tiles);  // of the segment's column tiles
    epilogue(m0, M, segment);
    if (tid == 0) counters[counter] = 0u;
#endif
}
