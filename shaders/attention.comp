#version 450
// Paged attention over the flattened batch (prefill chunks and decode tokens alike), split along
// the keys (flash-decoding) so that a decode step has many workgroups per layer.
//
// A query at position p sees the keys of its sequence at positions [lo, p], lo = max(0, p - window + 1)
// for sliding layers (0 for global ones); key position k lives at slot
// table[seq][k / block_size] * block_size + k % block_size.
//
// Chunks: the keys are cut at multiples of a span cs of absolute positions, cs = pc.chunk doubled
// while [lo, p] would meet more than MAX_CHUNKS chunks; chunk c covers [c cs, (c + 1) cs) ∩ [lo, p].
// cs, the chunks and every sum below depend only on p and the model (never on T, the batch's
// contexts or the grid), so a token's output is bit-identical in any batch and any prefill
// chunking. The host mirrors the rule in gemma_batch/backends/vulkan/attention.py.
//
// Grid: workgroup id = i * (T * nkv) + t * nkv + j, for chunk i of token t and kv head j; the host
// sizes i by the step's most chunks, and workgroups past their token's chunk count exit at once.
// Or, serial (grids.py: in steps with workgroups enough to fill the device without the chunks),
// id = t * nkv + j, the workgroup taking its token's chunks one after the other, each as its
// own workgroup would, and merging them itself: the same sums in the same order, so the same bits.
// A workgroup serves the G = nh / nkv query heads of kv head j (one read of each K/V row for the
// group; the scaled queries [G, hd] sit in shared memory) over its chunk, in passes of KB keys
// with an online softmax. Rows (kv_pages.glsl) are read as pieces of 8 elements, widened in
// registers (16 bytes of fp16 or bf16 pairs, 32 of fp32, or 8 of int8 times the row's scale):
//   scores   teams of KL = 4 adjacent lanes per key, lane l taking pieces l, l + 4, ... of the row
//            (4 lanes read 4 adjacent pieces); per lane dot products in piece order, then a
//            2-step xor butterfly per head (subgroups of 4 or more). A lane issues all loads of
//            its pieces before the first product (a loop that loaded one piece per iteration
//            left one load in flight per lane: about 30 us per layer whatever the batch).
//   softmax  a subgroup per head: subgroupMax, exp, per-lane sums in key order, subgroupAdd.
//   values   a thread per (piece, quad of heads) and key group: KG adjacent lanes (a power of
//            two, at most the subgroup) take keys kg, kg + KG, ... of the pass, so each V row piece
//            is read once per workgroup, VK keys' loads issued together; at the end of the chunk
//            an xor butterfly over the KG lanes adds the key groups.
// Merge: a token with a single chunk writes its output directly. Otherwise each chunk writes
// its partial (running max m, sum l and the unnormalised output acc of the G heads) to `part_*`
// at record i * T * nkv + t * nkv + j, and counts itself done on the (t, j) counter (serial: the
// workgroup, once it has written them all, goes on); the last of the token's chunks to
// finish merges them in chunk order, M = max_i m_i, o = (sum_i acc_i e^(m_i - M)) / (sum_i l_i e^(m_i - M)),
// and resets the counter (zeroed by the host at the start of the step; attention_merge.glsl).
// Which workgroup is last does not change the result: it reads the same records in the same
// order. A last-workgroup merge rather than a second dispatch: no extra dispatch and pipeline
// barrier per layer (26 per step for the 1b), and the partials are merged while they are still
// in cache.
//
// Tokens whose token_seq is -1 (prompt tokens, where attention_flash.comp runs) are skipped.
//
// Variants: KV_F16 | KV_BF16 | KV_F32 | KV_I8 (the page storage), each also with SPLIT_OUT (on the
// cooperative path: the o projection's input written here, attention_merge.glsl), and with SPLIT_OUT
// and QK_IN (small decode steps: the heads made here from qkv's K-chunk sums, attention_heads.glsl). Limits
// (backend._check_supported): head_dim a multiple of 8 up to 256, G <= 16, G * head_dim <= QMAX.
// GMAX, the largest G a pipeline serves, is specialization constant 1 (kernels.Kernels sets the
// model's G): it sizes the per-head arrays, and registers held for heads a model does not have
// cost occupancy (4b, batch 32: 6.95 against 7.27 ms per decode step with G = 2 against 16,
// 2026-11-24).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require  // [[unroll]]: the per-head arrays stay in registers
#include "common.glsl"
#include "kv_pages.glsl"
#ifdef SPLIT_OUT
#include "split.glsl"
#include "workgroup.glsl"
#endif

#define WG 128
#define KB 64           // keys per pass
#define KL 4            // lanes per key in the score pass
#define KP 8            // pieces of a key row per lane: head_dim <= 8 * KL * KP = 256
#define VK 8            // keys whose V pieces a value-pass thread loads at once
#define MAX_CHUNKS 32   // attention.py: MAX_CHUNKS
layout(local_size_x = WG) in;
#define QMAX 2048       // G * head_dim, at most (the queries' shared memory)
layout(constant_id = 1) const uint GMAX = 16u;  // query heads per kv head, at most
const uint QUAD = GMAX < 4u ? GMAX : 4u;        // heads per value-pass thread
const uint Q4 = GMAX * 64u < QMAX / 4u ? GMAX * 64u : QMAX / 4u;  // vec4 of queries: G * hd <= GMAX * 256

#ifndef QK_IN  // (QK_IN: attention_heads.glsl)
layout(std430, binding = 0) readonly buffer Qb { vec4 q4[]; };       // [T, nh, hd]
#endif
#ifdef SPLIT_OUT
layout(std430, binding = 1) coherent buffer Ob { vec4 o4[]; };       // [T, nh, hd], read back by split_when_last
layout(std430, binding = 11) writeonly buffer SOb { uint split_out[]; };  // [T, 2 nh hd] fp16: hi row, lo row
#ifndef QK_IN
layout(std430, binding = 12) writeonly buffer SSb { float split_scale_out[]; };  // [T]
#endif
#else
layout(std430, binding = 1) writeonly buffer Ob { vec4 o4[]; };      // [T, nh, hd]
#endif
layout(std430, binding = 2) readonly buffer Pb { int positions[]; };
layout(std430, binding = 3) readonly buffer Sb { int token_seq[]; };
layout(std430, binding = 4) readonly buffer Tb { int block_table[]; };
layout(std430, binding = 5) coherent buffer PAb { vec4 part_acc[]; };  // [records, G * hd]
layout(std430, binding = 9) coherent buffer PMb { float part_ml[]; };  // [records, 2, G]: m, then l
layout(std430, binding = 10) coherent buffer Cb { uint counters[]; };  // [T * nkv] (SPLIT_OUT: then [T])
#ifdef QK_IN  // the pages are written too (attention_heads.glsl), then read
#define PAGE_ACCESS coherent
#else
#define PAGE_ACCESS readonly
#endif
#include "kv_rows.glsl"

layout(push_constant) uniform Push {
    uint num_heads;
    uint num_kv_heads;
    uint head_dim;
    uint window;        // 0: global layer
    uint block_size;
    uint table_stride;  // block-table entries per sequence
    uint chunk;         // the smallest chunk span (attention.py: DEFAULT_CHUNK)
    float scale;        // query_pre_attn_scalar ** -0.5
    uint qkv_chunks;    // QK_IN: the K chunks of qkv's partial sums
    float eps;          // QK_IN: the QK-norm's
} pc;
// Sizes a pipeline may have specialised in (push_constants.SPECIALIZED: graph.py does for the
// decode variant _split_qk), each 0 where it is not, read from the push constants then.
// Specialised, the compiler folds their divisions, bounds and loop counts, and the binary shrinks:
// a workgroup runs its code about once, and a dependent dispatch pays for fetching it (4b on the
// H100: _split_qk 58 KiB against 79, batch-1 decode step 4.89-4.91 against 5.13-5.15 ms;
// the journal, `git show 4d73df3:docs/PERFORMANCE.md`, "Code size").
layout(constant_id = 7) const uint SPEC_HEAD_DIM = 0u;
layout(constant_id = 8) const uint SPEC_NUM_HEADS = 0u;
layout(constant_id = 9) const uint SPEC_NUM_KV_HEADS = 0u;
layout(constant_id = 10) const uint SPEC_BLOCK_SIZE = 0u;
layout(constant_id = 11) const uint SPEC_CHUNK = 0u;
layout(constant_id = 12) const uint SPEC_QKV_CHUNKS = 0u;
#define HEAD_DIM (SPEC_HEAD_DIM != 0u ? SPEC_HEAD_DIM : pc.head_dim)
#define NUM_HEADS (SPEC_NUM_HEADS != 0u ? SPEC_NUM_HEADS : pc.num_heads)
#define NUM_KV_HEADS (SPEC_NUM_KV_HEADS != 0u ? SPEC_NUM_KV_HEADS : pc.num_kv_heads)
#define BLOCK_SIZE (SPEC_BLOCK_SIZE != 0u ? SPEC_BLOCK_SIZE : pc.block_size)
#define CHUNK (SPEC_CHUNK != 0u ? SPEC_CHUNK : pc.chunk)
#define QKV_CHUNKS (SPEC_QKV_CHUNKS != 0u ? SPEC_QKV_CHUNKS : pc.qkv_chunks)

shared vec4 qs[Q4];                 // the group's queries, scaled: [G, hd]
shared float sc[GMAX * KB];         // this pass's scores, then probabilities: [G, KB]
shared uint krow[KB];               // this pass's page rows (slot * nkv + j)
shared float run_max[GMAX], run_sum[GMAX], rescale[GMAX];
shared float weight[MAX_CHUNKS * GMAX];  // merge: e^(m_i - M), [chunk, G]
shared float total[GMAX];                // merge: sum_i l_i e^(m_i - M)
shared bool last_of_token;

const float NEG = -1.0e30;

#ifdef QK_IN
#include "attention_heads.glsl"
#endif
#include "attention_merge.glsl"

// Sum over clusters of `width` adjacent lanes (a power of two, at most the subgroup size) by xor
// butterfly: every lane of a cluster gets the same value.
float cluster_sum(float v, uint width) {
    for (uint m = 1u; m < width; m <<= 1) v += subgroupShuffleXor(v, m);
    return v;
}
vec4 cluster_sum4(vec4 v, uint width) {
    for (uint m = 1u; m < width; m <<= 1) v += subgroupShuffleXor(v, m);
    return v;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint nkv = NUM_KV_HEADS, tokens_heads = meta.num_tokens * nkv;
    // The serial grid (the header) has under 2 T nkv workgroups; the chunked grid T nkv times the
    // step's most chunks (where that is 1, the two are the same).
    uint id = linear_group();
    bool serial = gl_NumWorkGroups.x * gl_NumWorkGroups.y < 2u * tokens_heads;
    uint tj = serial ? id : id % tokens_heads, ci = serial ? 0u : id / tokens_heads;
    if (tj >= tokens_heads) return;
    uint t = tj / nkv, j = tj % nkv;
    if (token_seq[t] < 0) return;  // a prompt token on attention_flash.comp
    uint hd = HEAD_DIM, hd8 = hd / 8u, G = NUM_HEADS / nkv;
    uint p = uint(positions[t]);
    uint lo = pc.window == 0u ? 0u : uint(max(0, int(p) - int(pc.window) + 1));
    uint cs = CHUNK;
    while (p / cs - lo / cs + 1u > MAX_CHUNKS) cs *= 2u;
    uint first = lo / cs, nchunks = p / cs - first + 1u;
    if (ci >= nchunks) return;
    uint table = uint(token_seq[t]) * pc.table_stride;
    uint qbase = (t * NUM_HEADS + j * G) * hd / 4u;  // vec4 index of the group's queries and outputs

#ifdef QK_IN
    heads_in(t, j, p, serial || ci == nchunks - 1u);
#else
    for (uint e = tid; e < G * hd / 4u; e += WG) qs[e] = q4[qbase + e] * pc.scale;
#endif
    // Value-pass roles: unit = (piece, heads QUAD hq .. QUAD hq + QUAD - 1), KG lanes per unit.
    uint units = (G + QUAD - 1u) / QUAD * hd8;
    uint KG = min(gl_SubgroupSize, 1u << uint(findMSB(WG / units)));
    uint kg = tid % KG, unit = tid / KG;
    uint piece = unit % hd8, g0 = unit / hd8 * QUAD;
    bool valued = unit < units;
    vec4 acc[2u * QUAD];  // heads g0 + gg, elements 8 piece .. 8 piece + 7: acc[2 gg], acc[2 gg + 1]
    uint team = tid / KL, lane = tid % KL;
    bool writer = valued && kg == 0u;
    uint rec = G * hd / 4u;  // vec4 per record of part_acc

    for (uint c_end = serial ? nchunks : ci + 1u; ci < c_end; ci++) {
        uint k0 = max(lo, (first + ci) * cs), k1 = min(p + 1u, (first + ci + 1u) * cs);
        if (tid < G) { run_max[tid] = NEG; run_sum[tid] = 0.0; }
        [[unroll]] for (uint i = 0u; i < 2u * QUAD; i++) acc[i] = vec4(0.0);
        barrier();
        for (uint base = k0; base < k1; base += KB) {
            uint n = min(uint(KB), k1 - base);
            // Scores of the pass's keys (a team's lanes share their key, so the butterfly's lanes are active).
            for (uint k = team; k < n; k += WG / KL) {
                uint key = base + k;
                uint row = (uint(block_table[table + key / BLOCK_SIZE]) * BLOCK_SIZE + key % BLOCK_SIZE) * nkv + j;
                vec4 klo[KP], khi[KP];  // the lane's pieces of the key's row, all loads issued first
                [[unroll]] for (uint i = 0u; i < KP; i++) LOAD8(k4, row, min(lane + i * KL, hd8 - 1u), klo[i], khi[i]);
                float s[GMAX];
                [[unroll]] for (uint g = 0u; g < GMAX; g++) s[g] = 0.0;
                [[unroll]] for (uint i = 0u; i < KP; i++) {
                    uint c = lane + i * KL;
                    if (c >= hd8) break;
                    [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                        if (g >= G) break;
                        s[g] += dot(qs[2u * (g * hd8 + c)], klo[i]) + dot(qs[2u * (g * hd8 + c) + 1u], khi[i]);
                    }
                }
                [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                    if (g >= G) break;
                    s[g] = cluster_sum(s[g], KL);
                }
                if (lane == 0u) {
                    [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                        if (g >= G) break;
                        sc[g * KB + k] = s[g];
                    }
                    krow[k] = row;
                }
            }
            barrier();
            // Online softmax, a subgroup per head: the pass's max (exact in any order), probabilities,
            // their sum, and the rescale of what came before.
            for (uint g = gl_SubgroupID; g < G; g += gl_NumSubgroups) {
                float mx = NEG;
                for (uint k = gl_SubgroupInvocationID; k < n; k += gl_SubgroupSize) mx = max(mx, sc[g * KB + k]);
                float m_old = run_max[g], m_new = max(m_old, subgroupMax(mx));
                float sum = 0.0;
                for (uint k = gl_SubgroupInvocationID; k < n; k += gl_SubgroupSize) {
                    float e = exp(sc[g * KB + k] - m_new);
                    sc[g * KB + k] = e;
                    sum += e;
                }
                sum = subgroupAdd(sum);
                if (subgroupElect()) {
                    float r = exp(m_old - m_new);
                    rescale[g] = r;
                    run_sum[g] = run_sum[g] * r + sum;
                    run_max[g] = m_new;
                }
            }
            barrier();
            // Probabilities times V rows, per key group in key order.
            if (valued) {
                [[unroll]] for (uint gg = 0u; gg < QUAD; gg++) {
                    if (g0 + gg >= G) break;
                    acc[2u * gg] *= rescale[g0 + gg];
                    acc[2u * gg + 1u] *= rescale[g0 + gg];
                }
                for (uint k0 = kg; k0 < n; k0 += VK * KG) {
                    vec4 vlo[VK], vhi[VK];  // VK keys' pieces, all loads issued first
                    [[unroll]] for (uint i = 0u; i < VK; i++) LOAD8(v4, krow[min(k0 + i * KG, n - 1u)], piece, vlo[i], vhi[i]);
                    [[unroll]] for (uint i = 0u; i < VK; i++) {
                        uint k = k0 + i * KG;
                        if (k >= n) break;
                        [[unroll]] for (uint gg = 0u; gg < QUAD; gg++) {
                            if (g0 + gg >= G) break;
                            float w = sc[(g0 + gg) * KB + k];
                            acc[2u * gg] += w * vlo[i];
                            acc[2u * gg + 1u] += w * vhi[i];
                        }
                    }
                }
            }
            barrier();  // sc and krow are reused by the next pass
        }
        [[unroll]] for (uint i = 0u; i < 2u * QUAD; i++) acc[i] = cluster_sum4(acc[i], KG);

        if (nchunks == 1u) {
            if (writer) {
                [[unroll]] for (uint gg = 0u; gg < QUAD; gg++) {
                    uint g = g0 + gg;
                    if (g >= G) break;
                    uint e = qbase + (g * hd8 + piece) * 2u;
                    o4[e] = acc[2u * gg] / run_sum[g];
                    o4[e + 1u] = acc[2u * gg + 1u] / run_sum[g];
                }
            }
#ifdef SPLIT_OUT
            split_when_last(t, tokens_heads);
#endif
            return;
        }

        // This chunk's partial (record ci T nkv + tj), then the merge by the last of the token's
        // chunks (serial: by this workgroup, once it has them all).
        uint r = ci * tokens_heads + tj;
        if (writer) {
            [[unroll]] for (uint gg = 0u; gg < QUAD; gg++) {
                uint g = g0 + gg;
                if (g >= G) break;
                uint e = r * rec + (g * hd8 + piece) * 2u;
                part_acc[e] = acc[2u * gg];
                part_acc[e + 1u] = acc[2u * gg + 1u];
            }
        }
        if (tid < G) {
            part_ml[r * 2u * G + tid] = run_max[tid];
            part_ml[r * 2u * G + G + tid] = run_sum[tid];
        }
    }
    if (serial) {
        memoryBarrierBuffer();
        barrier();
    } else {
        RETURN_UNLESS_LAST(last_of_token, counters[tj], nchunks);  // of the token's chunks
    }
    merge_chunks(tj, tokens_heads, nchunks, G, hd, qbase);
#ifdef SPLIT_OUT
    split_when_last(t, tokens_heads);
#endif
}
