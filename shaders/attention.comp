#version 450
// Paged attention over the flattened batch (prefill chunks and decode tokens alike).
// One workgroup per (token, kv head) serves the GQA group of query heads that share the kv head,
// so each K/V row is read once per group. A query at position p sees the keys of its sequence at
// positions [lo, p], lo = max(0, p - window + 1) for sliding layers (0 for global ones); key
// position k lives at slot table[seq][k / block_size] * block_size + k % block_size.
// Keys are taken in chunks of WG with an online softmax; every sum runs in a fixed order that
// depends only on the query's own position, so the result is batch- and chunking-invariant.
// Variants: KV_F16 | KV_F32 (the page storage).
#include "common.glsl"
#define WG 128
#define QMAX 2048  // group size * head_dim
#define GMAX 16
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Qb { float q[]; };
layout(std430, binding = 1) writeonly buffer Ob { float o[]; };
layout(std430, binding = 2) readonly buffer Pb { int positions[]; };
layout(std430, binding = 3) readonly buffer Sb { int token_seq[]; };
layout(std430, binding = 4) readonly buffer Tb { int block_table[]; };
#ifdef KV_F16
layout(std430, binding = 6) readonly buffer Kb { uint kpage[]; };
layout(std430, binding = 8) readonly buffer Vb { uint vpage[]; };
float kval(uint i) { vec2 p = unpackHalf2x16(kpage[i / 2]); return (i & 1u) == 0u ? p.x : p.y; }
float vval(uint i) { vec2 p = unpackHalf2x16(vpage[i / 2]); return (i & 1u) == 0u ? p.x : p.y; }
#else
layout(std430, binding = 6) readonly buffer Kb { float kpage[]; };
layout(std430, binding = 8) readonly buffer Vb { float vpage[]; };
float kval(uint i) { return kpage[i]; }
float vval(uint i) { return vpage[i]; }
#endif

layout(push_constant) uniform Push {
    uint num_heads;
    uint num_kv_heads;
    uint head_dim;
    uint window;        // 0: global layer
    uint block_size;
    uint table_stride;  // block-table entries per sequence
    float scale;        // query_pre_attn_scalar ** -0.5
} pc;

shared float qs[QMAX];       // the group's queries, scaled
shared float sc[GMAX][WG];   // this chunk's scores, then probabilities
shared uint kslot[WG];       // this chunk's key slots
shared float run_max[GMAX], run_sum[GMAX], rescale[GMAX];

const float NEG = -1.0e30;

void main() {
    uint id = linear_group();
    uint t = id / pc.num_kv_heads, j = id % pc.num_kv_heads;
    if (t >= meta.num_tokens) return;
    uint tid = gl_LocalInvocationID.x;
    uint hd = pc.head_dim, G = pc.num_heads / pc.num_kv_heads;
    uint seq = uint(token_seq[t]);
    int p = positions[t];
    uint lo = pc.window == 0u ? 0u : uint(max(0, p - int(pc.window) + 1));
    uint hi = uint(p) + 1u;

    for (uint e = tid; e < G * hd; e += WG) qs[e] = q[(t * pc.num_heads + j * G) * hd + e] * pc.scale;
    if (tid < G) { run_max[tid] = NEG; run_sum[tid] = 0.0; }
    float acc[QMAX / WG];
    for (uint i = 0; i < QMAX / WG; i++) acc[i] = 0.0;
    barrier();

    for (uint base = lo; base < hi; base += WG) {
        uint key = base + tid;
        if (key < hi) {
            uint slot = uint(block_table[seq * pc.table_stride + key / pc.block_size]) * pc.block_size + key % pc.block_size;
            kslot[tid] = slot;
            uint krow = (slot * pc.num_kv_heads + j) * hd;
            for (uint g = 0; g < G; g++) {
                float s = 0.0;
                for (uint d = 0; d < hd; d++) s += qs[g * hd + d] * kval(krow + d);
                sc[g][tid] = s;
            }
        } else {
            for (uint g = 0; g < G; g++) sc[g][tid] = NEG;
        }
        barrier();
        if (tid < G) {  // running max (exact in any order) and the rescale of what came before
            float mx = run_max[tid];
            for (uint c = 0; c < WG; c++) mx = max(mx, sc[tid][c]);
            rescale[tid] = exp(run_max[tid] - mx);
            run_max[tid] = mx;
        }
        barrier();
        for (uint g = 0; g < G; g++) {
            float s = sc[g][tid];
            sc[g][tid] = s <= NEG ? 0.0 : exp(s - run_max[g]);
        }
        barrier();
        if (tid < G) {
            float total = 0.0;
            for (uint c = 0; c < WG; c++) total += sc[tid][c];
            run_sum[tid] = run_sum[tid] * rescale[tid] + total;
        }
        uint n = min(uint(WG), hi - base);
        for (uint i = 0; i < QMAX / WG; i++) {
            uint e = tid + i * WG;
            if (e < G * hd) {
                uint g = e / hd, d = e % hd;
                float s = 0.0;
                for (uint c = 0; c < n; c++) s += sc[g][c] * vval((kslot[c] * pc.num_kv_heads + j) * hd + d);
                acc[i] = acc[i] * rescale[g] + s;
            }
        }
        barrier();
    }
    for (uint i = 0; i < QMAX / WG; i++) {
        uint e = tid + i * WG;
        if (e < G * hd) o[(t * pc.num_heads + j * G) * hd + e] = acc[i] / run_sum[e / hd];
    }
}
