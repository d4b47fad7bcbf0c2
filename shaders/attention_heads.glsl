// attention.comp's QK_IN prologue (its variants _split_qk, decode steps on the cooperative path):
// a workgroup makes its query heads (and, for the chunk holding the token's position, its k and v
// head) from the qkv matmul's K-chunk sums, instead of reading what reduce.comp EPI_QK_ROPE made
// of them, with the same bits. Included by attention.comp after its buffers, push constants and
// shared arrays; needs SPLIT_OUT (binding 12 holds qkv's input scales until the split overwrites
// them with o's).
#ifndef SPLIT_OUT
#error QK_IN needs SPLIT_OUT
#endif

layout(std430, binding = 0) readonly buffer Qb { float part[]; };    // qkv's K-chunk sums [chunks, Tpad, (nh + 2 nkv) hd]
layout(std430, binding = 12) buffer SSb { float split_scale_out[]; };  // [T]: qkv's input scales, then o's
layout(std430, binding = 13) readonly buffer Eb { float g_epi[]; };  // q_norm, k_norm [2 hd]
layout(std430, binding = 14) readonly buffer Fb { float inv_freq[]; };  // [hd / 2]
layout(std430, binding = 15) readonly buffer Lb { int slots[]; };
#ifdef KV_F32  // the pages (attention.comp declares them coherent under QK_IN too), as qk_rope.glsl writes them
layout(std430, binding = 6) coherent buffer KWb { float kpage[]; };
layout(std430, binding = 8) coherent buffer VWb { float vpage[]; };
#else
layout(std430, binding = 6) coherent buffer KWb { uint kpage[]; };
layout(std430, binding = 8) coherent buffer VWb { uint vpage[]; };
#endif

#define QK_VALS ((GMAX + 2u) * HD_MAX)  // the G query heads, then k, then v, HD_MAX apart
#include "qk_rope.glsl"

// The scaled queries of (token t, kv head j) into qs, made from the qkv matmul's K-chunk sums
// with the bits reduce.comp EPI_QK_ROPE gives them (its sums in its order, then qk_rope.glsl's
// arithmetic), instead of read from that reduce: in decode steps, whose tokens are their
// sequences' only ones, so a token's earlier keys are in the pages already. With `own_kv` (the
// chunk holding the token's position p) also its k and v head j, written into the pages at
// slots[t], which this workgroup then reads like any other key. The heads go together: every
// load is issued first, the sin and cos are the position's (once), and only the sums of
// squares wait for one another.
void heads_in(uint t, uint j, uint p, bool own_kv) {
    uint tid = gl_LocalInvocationID.x, hd = HEAD_DIM, half_hd = hd / 2u, nh = NUM_HEADS, nkv = NUM_KV_HEADS;
    uint G = nh / nkv, N = (nh + 2u * nkv) * hd, slot = (meta.num_tokens + 31u) / 32u * 32u * N;  // rows padded to 32 (COOP_ROWS)
    uint heads = G + (own_kv ? 2u : 0u);  // q heads j G .., then k head j, v head j
    float row_scale = split_scale_out[t];  // read before the token's split_when_last writes o's
    bool pair = tid < half_hd;  // this invocation rotates elements (tid, tid + hd / 2) of each head
    vec4 g = pair ? vec4(g_epi[tid], g_epi[tid + half_hd], g_epi[hd + tid], g_epi[hd + tid + half_hd]) : vec4(0.0);
    float freq = pair ? inv_freq[tid] : 0.0;
    float y[GMAX + 2u][2];  // the heads' values d = tid, tid + WG (hd <= 2 WG)
    float p_[GMAX + 2u][2][SUM_LOADS];
    for (uint c0 = 0u; c0 < QKV_CHUNKS; c0 += SUM_LOADS) {
        [[unroll]] for (uint h = 0u; h < GMAX + 2u; h++) [[unroll]] for (uint i = 0u; i < 2u; i++) {
            uint head = h < G ? j * G + h : h == G ? nh + j : nh + nkv + j, d = tid + i * WG;
            bool on = h < heads && d < hd;
            [[unroll]] for (uint c = 0u; c < SUM_LOADS; c++)
                p_[h][i][c] = on && c0 + c < QKV_CHUNKS ? part[(c0 + c) * slot + t * N + head * hd + d] : 0.0;
        }
        [[unroll]] for (uint h = 0u; h < GMAX + 2u; h++) [[unroll]] for (uint i = 0u; i < 2u; i++)
            [[unroll]] for (uint c = 0u; c < SUM_LOADS; c++)
                if (c0 + c < QKV_CHUNKS) y[h][i] = c0 + c == 0u ? p_[h][i][c] : y[h][i] + p_[h][i][c];
    }
    vec2 sc = pair ? sincos_reduced(float(int(p)) * freq) : vec2(0.0);
    float total[GMAX + 1u];  // the q heads' and k's sums of squares
    [[unroll]] for (uint h = 0u; h < GMAX + 2u; h++) {
        if (h >= heads) break;
        [[unroll]] for (uint i = 0u; i < 2u; i++) {
            y[h][i] *= row_scale;  // (0 past hd: no chunk was loaded there)
            if (tid + i * WG < hd) vals[h * HD_MAX + tid + i * WG] = y[h][i];
        }
        if (h <= G) total[h] = workgroup_sum(sum_squares(y[h][0], y[h][1]));  // (its barriers publish vals)
    }
    barrier();  // (the v head's vals, with no sum after it)
    if (pair) {
        float inv_rms[GMAX + 1u];  // (apart from the loop below: the heads' chains run side by side)
        [[unroll]] for (uint h = 0u; h < GMAX + 1u; h++) inv_rms[h] = h <= G && h < heads ? qk_inv_rms(total[h], hd, pc.eps) : 0.0;
        [[unroll]] for (uint h = 0u; h < GMAX + 1u; h++) {
            if (h > G || h >= heads) break;  // the q heads and k
            uint at = h * HD_MAX;
            vec2 r = norm_rope_pair(vals[at + tid], vals[at + tid + half_hd], inv_rms[h], h < G ? g.x : g.z, h < G ? g.y : g.w, sc);
            vals[at + tid] = r.x;
            vals[at + tid + half_hd] = r.y;
        }
    }
    barrier();
    for (uint e = tid; e < G * hd / 4u; e += WG) {  // q as the reduce writes it, then scaled as read
        uint at = e / (hd / 4u) * HD_MAX + 4u * (e % (hd / 4u));
        qs[e] = vec4(vals[at], vals[at + 1u], vals[at + 2u], vals[at + 3u]) * pc.scale;
    }
    if (own_kv) {
        store_page_row(uint(slots[t]) * nkv + j, hd, false, G * HD_MAX);
        store_page_row(uint(slots[t]) * nkv + j, hd, true, (G + 1u) * HD_MAX);
        memoryBarrierBuffer();  // the pages' new rows before this workgroup reads them (after the next barrier)
    }
}
