#version 450
// EXPERIMENT (not shipped): shaders/matmul_coop_direct.comp in decode steps of up to PRO_ROWS
// tokens, with the reduce before it run by every workgroup as a prologue instead of in a
// dispatch of its own, with the reduce's bits:
//   PRO_NORM   reduce_post_norm_split of the matmul before (o, or the last layer's down): its
//              K-chunk sums (binding 3) times their scale, post-norm add into the residual (read
//              from binding 8, written to binding 9 by workgroup 0), RMS-normalised with the next
//              norm, split; the sums over the row in the order of reduce.comp's 640 invocations
//              (4b: variants.post_norm_row_shape), emulated by 128.
//   PRO_GATED  reduce_gated_split of gate/up: act = gelu_tanh(gate) * up, its max over the row
//              (exact in any order), split.
// Each workgroup keeps the split of its own K chunk in shared memory (xf4) and its x stage reads
// from there; workgroup 0 writes the row's scale (binding 6) for the reduce after this matmul.
// push: group = the K chunks of the matmul before.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "split.glsl"
#include "workgroup.glsl"

#define SG_N 4
#define TN 2
#define TM 2
#define KS 4
#define WG (32 * SG_N)
#define BN (16 * SG_N * TN)
#define BM (16 * TM)
#define XV (2 * KS)
#define PAD (XV + 1)
#define X_LOADS (2 * BM * XV / WG)
#define PRO_ROWS 2
#define PRO_WORDS 2048           // words of a row's own chunk at most (kchunk halves, hi and lo)
#ifndef PRO_BATCH
#define PRO_BATCH 16             // vec4 loads of the prologue in flight an invocation
#endif
layout(local_size_x = WG) in;
layout(constant_id = 0) const bool X_LO = true;

layout(std430, binding = 0) readonly buffer Wb { uvec4 w4[]; };
layout(std430, binding = 2) writeonly buffer Pb { float part[]; };
layout(std430, binding = 3) readonly buffer PPb { vec4 pp4[]; };      // the matmul before: K-chunk sums
layout(std430, binding = 4) readonly buffer W2b { uvec4 u4[]; };
layout(std430, binding = 5) readonly buffer SIb { float scale_in[]; };  // their rows' scales
layout(std430, binding = 6) writeonly buffer SOb { float scale_out[]; };  // this matmul's input scales
#ifdef PRO_NORM
layout(std430, binding = 8) readonly buffer XIb { vec4 x_in4[]; };
layout(std430, binding = 9) writeonly buffer XOb { vec4 x_out4[]; };
layout(std430, binding = 10) readonly buffer GEb { vec4 g_epi4[]; };
layout(std430, binding = 11) readonly buffer GNb { vec4 g_next4[]; };
#endif
layout(push_constant) uniform Push {
    uint N;
    uint K;
    uint kchunk;
    uint group;      // the K chunks of the matmul before
    uint fold_rows;  // unused
} pc;

shared uvec4 xsh[2 * BM * PAD];
shared uvec4 xf4[PRO_ROWS * PRO_WORDS / 4];  // the split of this workgroup's K chunk: [row][hi kchunk / 2 | lo kchunk / 2] words

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#include "coop_fragment.glsl"

// vec4 l of this workgroup's chunk (scaled values sv) into xf4 as split_words would write it.
void put_split(uint m, uint l, vec4 sv) {
    uvec2 a = split_words(sv.xy), b = split_words(sv.zw);
    uint at = m * PRO_WORDS + 2u * l, lo = at + pc.kchunk / 2u;  // (words: even, so a pair within one uvec4)
    xf4[at >> 2][at & 3u] = a.x;
    xf4[at >> 2][(at & 3u) + 1u] = b.x;
    xf4[lo >> 2][lo & 3u] = a.y;
    xf4[lo >> 2][(lo & 3u) + 1u] = b.y;
}

#ifdef PRO_NORM
#define VWG 640u                 // reduce_post_norm_split's invocations (4b), a vec4 each
#define VR (VWG / WG)            // virtual invocations per invocation: round r is virtual subgroup gl_SubgroupID + SG_N r
shared float vred[VWG / 32u];

// reduce.comp's workgroup_sum over its VWG invocations, whose values this invocation holds for its rounds.
float vsum(float s[VR]) {
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        float t = subgroupAdd(s[r]);
        if (subgroupElect()) vred[gl_SubgroupID + SG_N * r] = t;
    }
    barrier();
    float total = 0.0;
    for (uint j = 0u; j < VWG / 32u; j++) total += vred[j];
    barrier();
    return total;
}

void prologue(uint M, uint m, uint c, bool first) {
#ifdef PRO_SKIP
    return;
#endif
    uint H = pc.K, H4 = H / 4u, chunks = pc.group, slot4 = (M + BM - 1u) / BM * BM * H4;
    uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
    float sc = scale_in[m];
    vec4 v[VR], xr[VR], g[VR];
    // the chunk sums, in chunk order, PRO_BATCH loads at a time
    [[unroll]] for (uint r = 0u; r < VR; r++) v[r] = vec4(0.0);
    uint loads = VR * chunks;
    for (uint b0 = 0u; b0 < loads; b0 += PRO_BATCH) {
        vec4 p[PRO_BATCH];
        [[unroll]] for (uint i = 0u; i < PRO_BATCH; i++) {
            uint e = b0 + i, r = e % VR, cc = e / VR, n4 = 32u * (sg + SG_N * r) + lane;
            p[i] = e < loads ? pp4[cc * slot4 + m * H4 + n4] : vec4(0.0);
        }
        [[unroll]] for (uint i = 0u; i < PRO_BATCH; i++) {
            uint e = b0 + i, cc = e / VR;
            [[unroll]] for (uint r = 0u; r < VR; r++)
                if (e < loads && e % VR == r) v[r] = cc == 0u ? p[i] : v[r] + p[i];
        }
    }
#ifdef PRO_LOADS
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        uint n4 = 32u * (sg + SG_N * r) + lane, l0 = c * pc.kchunk / 4u;
        if (n4 >= l0 && n4 < l0 + pc.kchunk / 4u) put_split(m, n4 - l0, v[r] * sc);
    }
    return;
#endif
    float ss[VR];
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        uint n4 = 32u * (sg + SG_N * r) + lane;
        v[r] = v[r] * sc;
        ss[r] = dot(v[r], v[r]);
        xr[r] = x_in4[m * H4 + n4];
        g[r] = g_epi4[n4];
    }
    // post_norm_add
    float denom = sqrt(vsum(ss) / float(H) + 1e-6);
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        uint n4 = 32u * (sg + SG_N * r) + lane;
        v[r] = xr[r] + v[r] / denom * (1.0 + g[r]);
        if (first) x_out4[m * H4 + n4] = v[r];
        ss[r] = dot(v[r], v[r]);
    }
    // SPLIT_ROW with NORM_NEXT
    float inv = 1.0 / sqrt(vsum(ss) / float(H) + 1e-6);
    float mx = 0.0;
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        uint n4 = 32u * (sg + SG_N * r) + lane;
        v[r] = v[r] * (1.0 + g_next4[n4]);
        vec4 a = abs(v[r]);
        mx = max(mx, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float s = split_scale(workgroup_max(mx) * inv);
    uint l0 = c * pc.kchunk / 4u, l1 = l0 + pc.kchunk / 4u;
    [[unroll]] for (uint r = 0u; r < VR; r++) {
        uint n4 = 32u * (sg + SG_N * r) + lane;
        if (n4 >= l0 && n4 < l1) put_split(m, n4 - l0, v[r] * inv * s);
    }
    if (first && gl_LocalInvocationIndex == 0u) scale_out[m] = 1.0 / s;
}
#endif

#ifdef PRO_GATED
shared vec4 actf[PRO_WORDS / 4u];  // act of this workgroup's chunk, one row at a time

void prologue(uint M, uint m, uint c, bool first) {
#ifdef PRO_SKIP
    return;
#endif
    uint I = pc.K, W4 = I / 2u, slot4 = (M + BM - 1u) / BM * BM * W4, tid = gl_LocalInvocationIndex;
    uint chunks = pc.group, per = I / 4u / WG;  // vec4 of act an invocation
    float sc = scale_in[m], mx = 0.0;
    uint l0 = c * pc.kchunk / 4u, l1 = l0 + pc.kchunk / 4u;
    for (uint i0 = 0u; i0 < per; i0 += PRO_BATCH / 4u) {
        vec4 gs[PRO_BATCH / 4u], us[PRO_BATCH / 4u];
        [[unroll]] for (uint j = 0u; j < PRO_BATCH / 4u; j++) {
            uint n4 = (i0 + j) * WG + tid;
            bool on = i0 + j < per;
            vec4 g0 = on ? pp4[m * W4 + n4] : vec4(0.0), u0 = on ? pp4[m * W4 + I / 4u + n4] : vec4(0.0);
            vec4 g1 = on && chunks > 1u ? pp4[slot4 + m * W4 + n4] : vec4(0.0);
            vec4 u1 = on && chunks > 1u ? pp4[slot4 + m * W4 + I / 4u + n4] : vec4(0.0);
            gs[j] = (chunks > 1u ? g0 + g1 : g0) * sc;
            us[j] = (chunks > 1u ? u0 + u1 : u0) * sc;
        }
        [[unroll]] for (uint j = 0u; j < PRO_BATCH / 4u; j++) {
            uint n4 = (i0 + j) * WG + tid;
            if (i0 + j >= per) continue;
            vec4 gg = gs[j];
            vec4 a = vec4(gelu_tanh(gg.x), gelu_tanh(gg.y), gelu_tanh(gg.z), gelu_tanh(gg.w)) * us[j];
            vec4 aa = abs(a);
            mx = max(mx, max(max(aa.x, aa.y), max(aa.z, aa.w)));
            if (n4 >= l0 && n4 < l1) actf[n4 - l0] = a;
        }
    }
#ifdef PRO_LOADS
    barrier();
    float s = 1.0;
#else
    float s = split_scale(workgroup_max(mx));  // (its barriers publish actf)
#endif
    for (uint l = tid; l < pc.kchunk / 4u; l += WG) put_split(m, l, actf[l] * s);
    barrier();  // actf is the next row's
    if (first && tid == 0u) scale_out[m] = 1.0 / s;
}
#endif

void main() {
    uint M = meta.num_tokens;
    uint m_groups = (M + BM - 1) / BM, n_groups = (pc.N + BN - 1) / BN, chunks = pc.K / pc.kchunk;
    uint total = m_groups * n_groups * chunks, id = linear_group();
#ifdef DIRECT_B
    if (id >= total || M > 1u) return;
#else
    if (id >= total || M > PRO_ROWS) return;
#endif
    uint c = id % chunks;
    uint m0 = 0u;
    uint n0 = (id / (chunks * m_groups)) * BN + gl_SubgroupID * TN * 16;
    uint tid = gl_LocalInvocationID.x;
    uint KB = pc.K / 16;
    bool live = n0 < pc.N;
#ifdef GATED
    bool up = n0 >= pc.N / 2;
    uint tile0 = ((up ? n0 - pc.N / 2 : n0) / 16) * KB;
#else
    bool up = false;
    uint tile0 = (n0 / 16) * KB;
#endif
    uint live_tm = min(TM, (M + 15) / 16), live_rows = 16 * live_tm;

    ACC acc[TN * TM];
    [[unroll]] for (uint i = 0; i < TN * TM; i++) acc[i] = ACC(0.0);
    uvec4 wf[KS * TN];
    MAT_A wm[KS * TN];
#define LOAD_TILES(buf, kb) [[unroll]] for (uint u = 0; u < KS; u++) [[unroll]] for (uint tn = 0; tn < TN; tn++) { \
        uint at_ = (tile0 + tn * KB + (kb) + u) * 32; \
        if (FRAGMENT_LOADS) wf[u * TN + tn] = buf[at_ + gl_SubgroupInvocationID]; \
        else coopMatLoad(wm[u * TN + tn], buf, at_, 2, gl_CooperativeMatrixLayoutRowMajor); }
#define LOAD_W(kb) if (up) { LOAD_TILES(u4, kb) } else { LOAD_TILES(w4, kb) }
    uint kb0 = c * (pc.kchunk / 16), kb1 = kb0 + pc.kchunk / 16;
    uvec4 xr[X_LOADS];
#define LOAD_X(kb) [[unroll]] for (uint i = 0; i < X_LOADS; i++) { \
        uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2; \
        if (row < live_rows && (X_LO || half_ == 0u)) { \
            xr[i] = xf4[min(row, M - 1u) * (PRO_WORDS / 4u) + half_ * (pc.kchunk / 8u) + 2u * ((kb) - kb0) + e % XV]; } }
#ifdef W_FIRST
    if (live) LOAD_W(kb0);
#endif
    for (uint m = 0u; m < M; m++) prologue(M, m, c, id == 0u);
    barrier();  // xf4
#ifndef W_FIRST
    if (live) LOAD_W(kb0);
#endif
#ifdef DIRECT_B
    // x's B fragments straight from xf4 (one row: column 0 of B is row 0; the other columns read
    // the next k blocks, their products land in partial's padding rows), no staging and no
    // barriers in the loop
    for (uint kb = kb0; kb < kb1; kb += KS) {
        if (live) {
            MAT_A cur[KS * TN];
            [[unroll]] for (uint i = 0; i < KS * TN; i++) cur[i] = FRAGMENT_LOADS ? fragment_of(wf[i]) : wm[i];
            if (kb + KS < kb1) LOAD_W(kb + KS);
            [[unroll]] for (uint u = 0; u < KS; u++) {
                MAT_B hi;
                MAT_B lo;
                coopMatLoad(hi, xf4, 2u * (kb - kb0 + u), 2u, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM] = coopMatMulAdd(cur[u * TN + tn], hi, acc[tn * TM]);
                if (X_LO) {
                    coopMatLoad(lo, xf4, pc.kchunk / 8u + 2u * (kb - kb0 + u), 2u, gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM] = coopMatMulAdd(cur[u * TN + tn], lo, acc[tn * TM]);
                }
            }
        }
    }
#else
    LOAD_X(kb0);
    for (uint kb = kb0; kb < kb1; kb += KS) {
        barrier();
        [[unroll]] for (uint i = 0; i < X_LOADS; i++) {
            uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2;
            if (row < live_rows && (X_LO || half_ == 0u)) xsh[(half_ * BM + row) * PAD + e % XV] = xr[i];
        }
        barrier();
        if (kb + KS < kb1) LOAD_X(kb + KS);
        if (live) {
            MAT_A cur[KS * TN];
            [[unroll]] for (uint i = 0; i < KS * TN; i++) cur[i] = FRAGMENT_LOADS ? fragment_of(wf[i]) : wm[i];
            if (kb + KS < kb1) LOAD_W(kb + KS);
            [[unroll]] for (uint u = 0; u < KS; u++) {
                [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                    if (tm >= live_tm) break;
                    MAT_B hi;
                    coopMatLoad(hi, xsh, (tm * 16) * PAD + 2 * u, PAD, gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM + tm] = coopMatMulAdd(cur[u * TN + tn], hi, acc[tn * TM + tm]);
                    if (X_LO) {
                        MAT_B lo;
                        coopMatLoad(lo, xsh, (BM + tm * 16) * PAD + 2 * u, PAD, gl_CooperativeMatrixLayoutColumnMajor);
                        [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM + tm] = coopMatMulAdd(cur[u * TN + tn], lo, acc[tn * TM + tm]);
                    }
                }
            }
        }
    }
#endif
    if (live) {
        uint base = c * m_groups * BM * pc.N;
        [[unroll]] for (uint tn = 0; tn < TN; tn++) {
            [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                if (tm >= live_tm) break;
                coopMatStore(acc[tn * TM + tm], part, base + (m0 + tm * 16) * pc.N + n0 + tn * 16, pc.N,
                             gl_CooperativeMatrixLayoutColumnMajor);
            }
        }
    }
}
