#version 450
// After a cooperative-matrix matmul (matmul_coop.comp): y[m, n] = (sum over chunks c, in order,
// of partial[c, m, n]) * scale[m] (split.comp's power of two), then the matmul's epilogue.
// Which chunks a row has and where they lie: partial_rows.glsl (a prompt token's row, one sum).
//
// Variants (the epilogues of matmul.comp, on rows of y):
//   (none) / ROWS  y to binding 2, a workgroup per WG outputs of a row (ROWS: M = meta.num_rows,
//                  4 WG outputs)
//   GATED          partial holds [gate | up] (2 N columns): act[m, n] = gelu_tanh(gate) * up
//   EPI_NORM_ADD   x_res[m] += rms_norm(y[m]) * (1 + g_epi): a workgroup per row, y in registers
//   EPI_QK_ROPE    a workgroup per (row, head): the head into shared memory, then QK-norm, RoPE,
//                  q out and the KV pages
// and with SPLIT_NEXT, the next matmul's input written as split.comp would (split.glsl), which
// saves that dispatch: after EPI_NORM_ADD, the new x_res row RMS-normalised with (1 + g_next);
// with GATED, act itself: pieces of a row in parallel, the last to finish splitting it, or with
// WHOLE_ROWS a workgroup per row (the same bits either way).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "split.glsl"
#include "workgroup.glsl"

#if defined(GATED) && defined(SPLIT_NEXT) && defined(WHOLE_ROWS)
#define WG 1024               // a workgroup per row (variants.GATED_ROW_WG), every load of a row in flight at once
// The vec4 of a row an invocation holds: rows of up to 6 * 4 * 1024 = variants.GATED_SPLIT_MAX_ROW
// values, set by kernels.Kernels for the model's (gated_row_vec, whole rounds of ACT_ROUND; 4b: 3).
// Sized for the model the binary holds no code for vec4 past its rows: 4b on the H100, 40 KiB
// against 78, median batch-32 decode step 5.64-5.67 against 5.71-5.73 ms (the journal, `git show 4d73df3:docs/PERFORMANCE.md`).
layout(constant_id = 5) const uint ACT_VEC = 6u;
#elif defined(GATED) && defined(SPLIT_NEXT)
#define WG 512                // a piece of variants.GATED_SPLIT_PIECE = 4 WG columns a workgroup
#elif defined(EPI_NORM_ADD)
// A workgroup per row of EPI_VEC vec4 an invocation, both set by kernels.Kernels from the hidden
// size (specialization constants 3 and 4: variants.post_norm_row_shape).
layout(local_size_x_id = 3, local_size_x = 128) in;
#define WG gl_WorkGroupSize.x
#define EPI_VEC_ID 4
#else
#define WG 128
#endif
#define MT 1                  // rows per workgroup, for matmul_epilogue.glsl
#ifndef EPI_NORM_ADD
layout(local_size_x = WG) in;
#endif

layout(std430, binding = 0) readonly buffer Partb { float part[]; };
layout(std430, binding = 0) readonly buffer Part4b { vec4 part4[]; };  // the same, 16 bytes at a time
layout(std430, binding = 0) readonly buffer Part2b { vec2 part2[]; };  // ... and 8
#ifdef SPLIT_NEXT
layout(std430, binding = 4) buffer Scaleb { float scale[]; };  // read for this matmul, then written for the next
layout(std430, binding = 3) readonly buffer Gnb { vec4 g_next4[]; };
layout(std430, binding = 5) writeonly buffer Ob { uint out_words[]; };
#else
layout(std430, binding = 4) readonly buffer Scaleb { float scale[]; };
#endif
#if defined(EPI_NORM_ADD) || defined(EPI_QK_ROPE)
#define EPILOGUE
layout(std430, binding = 2) coherent buffer Yb { float y[]; };
layout(std430, binding = 9) readonly buffer Eb { float g_epi[]; };
#elif defined(GATED) && defined(SPLIT_NEXT)
layout(std430, binding = 2) coherent buffer Yb { vec4 act4[]; };      // act, read back by the row's last workgroup
#else
layout(std430, binding = 2) writeonly buffer Yb { float y[]; };
#ifdef ROWS
layout(std430, binding = 2) writeonly buffer Y4b { vec4 y4[]; };  // the same, 16 bytes at a time
#endif
#endif
#if defined(GATED) && defined(SPLIT_NEXT) && !defined(WHOLE_ROWS)
layout(std430, binding = 6) coherent buffer Rb { uint row_sync[]; };  // [2 M]: max |act| bits, then pieces done
shared bool last_of_row;
#endif
layout(push_constant) uniform Push {
    uint N;             // columns of y, or of act with GATED, whose partial has 2 N
    uint chunks;
    uint fold_rows;     // matmul_coop.comp's: above it the matmul summed the chunks itself
    float eps;
    uint num_heads;     // EPI_QK_ROPE: q heads, kv heads and head size of y's columns
    uint num_kv_heads;
    uint head_dim;
} pc;

#include "matmul_epilogue.glsl"
#include "partial_rows.glsl"

uint M_rows() {
#ifdef ROWS
    return meta.num_rows;
#else
    return meta.num_tokens;
#endif
}

// s (a float or vec4, type T) = the sum over row m's K chunks c = 0, 1, ... in order of its
// partial sums (partial_rows.glsl) at column `col` (in T) of rows `width` T wide.
#define CHUNK_SUM(T, BUF, m, width, col, s) { \
    uint d_ = chunked_rows(), chunks_ = (m) < d_ ? chunks_held(d_, pc.chunks) : 1u; \
    uint slot_ = chunk_slot_rows(d_) * (width), at_ = partial_row(m, d_, pc.chunks) * (width) + (col); \
    T p_[SUM_LOADS]; \
    for (uint c0 = 0; c0 < chunks_; c0 += SUM_LOADS) { \
        [[unroll]] for (uint i = 0; i < SUM_LOADS; i++) p_[i] = c0 + i < chunks_ ? BUF[(c0 + i) * slot_ + at_] : T(0.0); \
        [[unroll]] for (uint i = 0; i < SUM_LOADS; i++) if (c0 + i < chunks_) s = c0 + i == 0u ? p_[i] : s + p_[i]; \
    } }

// The chunks' sum for (m, column n) of a partial with `width` columns, times the row's scale.
float gather(uint width, uint m, uint n) {
    float s = 0.0;
    CHUNK_SUM(float, part, m, width, n, s);
    return s * scale[m];
}

// The same for the vec4 at columns 4 n4 ... 4 n4 + 3 of a partial with `width4` vec4 a row.
vec4 gather4(uint width4, uint m, uint n4) {
    vec4 s = vec4(0.0);
    CHUNK_SUM(vec4, part4, m, width4, n4, s);
    return s * scale[m];
}

#ifdef SPLIT_NEXT
// Write row m, this invocation's vec4 v[i] at 4 (i WG + tid) (zero past N, kept so), as the next
// matmul's input (split.glsl); with NORM_NEXT RMS-normalised with (1 + g_next) first.
#define SPLIT_ROW(VEC, m, v) { \
    uint tid_ = gl_LocalInvocationID.x; \
    float inv = 1.0; \
    if (NORM_NEXT) { \
        float ss = 0.0; \
        [[unroll]] for (uint i = 0; i < VEC; i++) ss += dot(v[i], v[i]); \
        inv = 1.0 / sqrt(workgroup_sum(ss) / float(pc.N) + pc.eps); \
    } \
    float mx = 0.0; \
    [[unroll]] for (uint i = 0; i < VEC; i++) { \
        uint n4 = i * WG + tid_; \
        if (NORM_NEXT) v[i] = v[i] * (1.0 + (4 * n4 < pc.N ? g_next4[n4] : vec4(0.0))); \
        vec4 a = abs(v[i]); \
        mx = max(mx, max(max(a.x, a.y), max(a.z, a.w))); \
    } \
    float s = split_scale(workgroup_max(mx) * inv); \
    [[unroll]] for (uint i = 0; i < VEC; i++) { \
        uint n4 = i * WG + tid_; \
        if (4 * n4 >= pc.N) continue; \
        vec4 sv = NORM_NEXT ? v[i] * inv * s : v[i] * s; \
        uvec2 a = split_words(sv.xy), b = split_words(sv.zw); \
        uint at = m * pc.N + 2 * n4; \
        out_words[at] = a.x; \
        out_words[at + 1] = b.x; \
        out_words[at + pc.N / 2] = a.y; \
        out_words[at + pc.N / 2 + 1] = b.y; \
    } \
    if (tid_ == 0) scale[m] = 1.0 / s; }
#endif

#if defined(GATED) && defined(SPLIT_NEXT)
// act of row m at columns 4 n4 ... 4 n4 + 3: gelu_tanh(gate) * up, each the chunks' sum (from
// chunk 0, in order) times the row's scale; partial holds [gate | up] (2 N columns).
vec4 act4_of(uint m, uint n4) {
    vec4 g = gather4(pc.N / 2, m, n4), u = gather4(pc.N / 2, m, pc.N / 4 + n4);  // rows of 2 N values
    return vec4(gelu_tanh(g.x), gelu_tanh(g.y), gelu_tanh(g.z), gelu_tanh(g.w)) * u;
}

#ifdef WHOLE_ROWS
#define ACT_ROUND 3  // vec4 of act per invocation whose loads are all issued before any is used

// This invocation's act of row m, act4_of(m, 4 (i WG + tid)) in v[i] (zero past N). With up to
// 2 chunks (every Gemma 3 shape's gate/up), the loads of ACT_ROUND vec4 go out together rather
// than one sum's at a time: the same sums, fewer round trips to L2 (a workgroup per row, so
// each row's latency is the step's).
void act_row(uint m, out vec4 v[ACT_VEC]) {
    uint tid = gl_LocalInvocationID.x, D = chunked_rows(), chunks = m < D ? chunks_held(D, pc.chunks) : 1u;
    if (chunks > 2u) {
        [[unroll]] for (uint i = 0; i < ACT_VEC; i++) {
            uint n4 = i * WG + tid;
            v[i] = 4 * n4 < pc.N ? act4_of(m, n4) : vec4(0.0);
        }
        return;
    }
    uint slot = chunk_slot_rows(D) * (pc.N / 2), row = partial_row(m, D, pc.chunks) * (pc.N / 2);  // vec4 per chunk; row m's first
    float s = scale[m];
    [[unroll]] for (uint r = 0; r < ACT_VEC; r += ACT_ROUND) {
        vec4 g0[ACT_ROUND], g1[ACT_ROUND], u0[ACT_ROUND], u1[ACT_ROUND];
        [[unroll]] for (uint j = 0; j < ACT_ROUND; j++) {
            uint n4 = (r + j) * WG + tid;
            bool on = 4 * n4 < pc.N, two = on && chunks == 2u;
            g0[j] = on ? part4[row + n4] : vec4(0.0);
            u0[j] = on ? part4[row + n4 + pc.N / 4] : vec4(0.0);
            g1[j] = two ? part4[slot + row + n4] : vec4(0.0);
            u1[j] = two ? part4[slot + row + n4 + pc.N / 4] : vec4(0.0);
        }
        [[unroll]] for (uint j = 0; j < ACT_ROUND; j++) {
            vec4 g = (chunks == 2u ? g0[j] + g1[j] : g0[j]) * s, u = (chunks == 2u ? u0[j] + u1[j] : u0[j]) * s;
            v[r + j] = 4 * ((r + j) * WG + tid) < pc.N ? vec4(gelu_tanh(g.x), gelu_tanh(g.y), gelu_tanh(g.z), gelu_tanh(g.w)) * u : vec4(0.0);
        }
    }
}
#endif
#endif

void main() {
    uint M = M_rows(), id = linear_group(), tid = gl_LocalInvocationID.x;
#if defined(EPI_NORM_ADD)
    // A workgroup per row: the chunks' sums times the row's scale (every chunk's loads in flight
    // at once), then post_norm_add and the next split. Before: a workgroup per 512 columns, the
    // row's last to finish normalising it; 4b on the H100, median decode step about 0.2 ms shorter
    // at batch 1 and 0.17 ms at 32 (the journal, `git show 4d73df3:docs/PERFORMANCE.md`).
    uint m = id;
    if (m >= M) return;
    vec4 v[EPI_VEC];
    [[unroll]] for (uint j = 0; j < EPI_VEC; j++) {
        uint n4 = j * WG + tid;
        v[j] = 4 * n4 < pc.N ? gather4(pc.N / 4, m, n4) : vec4(0.0);
    }
    post_norm_add(m, v);
#ifdef SPLIT_NEXT
#define NORM_NEXT true
    SPLIT_ROW(EPI_VEC, m, v);
#endif
#elif defined(GATED) && defined(SPLIT_NEXT) && defined(WHOLE_ROWS)
    // A workgroup per row, act in registers (act_row), then split.
    uint m = id;
    if (m >= M) return;
    vec4 v[ACT_VEC];
    act_row(m, v);
#define NORM_NEXT false
    SPLIT_ROW(ACT_VEC, m, v);
#elif defined(GATED) && defined(SPLIT_NEXT)
    // A row in pieces of 4 WG columns, a workgroup each: act of the piece (chunks in order, as
    // gather()) to act4, its max |act| into row_sync; the row's last workgroup to finish then
    // splits the whole row (act read back, still in cache) and resets row_sync (zeroed by the
    // host at the start of the step). Neither the pieces nor which workgroup is last change a bit
    // against WHOLE_ROWS: the max is exact and the split reads the same values.
    uint pieces = (pc.N + 4 * WG - 1) / (4 * WG);  // graph.py: variants.GATED_SPLIT_PIECE columns each
    uint m = id / pieces, n4 = (id % pieces) * WG + tid;
    if (m >= M) return;
    uint row_n4 = pc.N / 4;
    float mx = 0.0;
    if (n4 < row_n4) {
        vec4 a = act4_of(m, n4);
        act4[m * row_n4 + n4] = a;
        a = abs(a);
        mx = max(max(a.x, a.y), max(a.z, a.w));
    }
    mx = workgroup_max(mx);
    if (tid == 0) atomicMax(row_sync[m], floatBitsToUint(mx));  // non-negative floats order as their bits
    RETURN_UNLESS_LAST(last_of_row, row_sync[M + m], pieces);  // of the row's pieces
    float s = split_scale(uintBitsToFloat(atomicOr(row_sync[m], 0u)));
    for (uint i4 = tid; i4 < row_n4 / 2; i4 += WG) {  // two vec4 (8 values, 4 words of hi and of lo) each
        vec4 a = act4[m * row_n4 + 2 * i4] * s, b = act4[m * row_n4 + 2 * i4 + 1] * s;
        uvec2 w0 = split_words(a.xy), w1 = split_words(a.zw), w2 = split_words(b.xy), w3 = split_words(b.zw);
        uint at = m * pc.N + 4 * i4;
        out_words[at] = w0.x;
        out_words[at + 1] = w1.x;
        out_words[at + 2] = w2.x;
        out_words[at + 3] = w3.x;
        out_words[at + pc.N / 2] = w0.y;
        out_words[at + pc.N / 2 + 1] = w1.y;
        out_words[at + pc.N / 2 + 2] = w2.y;
        out_words[at + pc.N / 2 + 3] = w3.y;
    }
    barrier();  // every invocation has read row_sync[m] before it is reset
    if (tid == 0) {
        scale[m] = 1.0 / s;
        row_sync[m] = 0u;
        row_sync[M + m] = 0u;
    }
#elif defined(EPI_QK_ROPE)
    uint heads = pc.num_heads + 2 * pc.num_kv_heads, m = id / heads, h = id % heads;
    if (m >= M) return;
    // The head's chunk sums (gather's, in chunk order) straight into vals, two neighbouring values
    // an invocation, every chunk's load in flight at once (head_dim <= 2 WG); then its epilogue.
    // Before: each value through gather() into y, then read back: 4b batch 32 on the H100, median
    // decode step 5.927-5.939 against 5.939-5.974 ms (docs/EXPERIMENTS.md, "The post-norm and gated reduces a workgroup per row").
    uint hd = pc.head_dim;
    if (2 * tid < hd) {
        vec2 s = vec2(0.0);
        CHUNK_SUM(vec2, part2, m, pc.N / 2, h * hd / 2 + tid, s);
        s *= scale[m];
        vals[2 * tid] = s.x;
        vals[2 * tid + 1] = s.y;
    }
    barrier();
    head_out(m, h);
#elif defined(ROWS)
    // The LM head's logits, a vec4 of neighbouring outputs an invocation (variants.ROWS_REDUCE_COLS
    // a workgroup; N is a multiple of coop_tiles.COOP_COLS), gather4's sums and scale. One output an
    // invocation took 2,048 workgroups a row of 262,144 (70 us a step at 4b batch 32 on the H100).
    uint per_row = (pc.N + 4u * WG - 1u) / (4u * WG), m = id / per_row, n4 = (id % per_row) * WG + tid;
    if (m >= M || 4u * n4 >= pc.N) return;
    y4[m * pc.N / 4u + n4] = gather4(pc.N / 4u, m, n4);
#else
    uint per_row = (pc.N + WG - 1) / WG, m = id / per_row, n = (id % per_row) * WG + tid;
    if (m >= M || n >= pc.N) return;
#ifdef GATED
    y[m * pc.N + n] = gelu_tanh(gather(2 * pc.N, m, n)) * gather(2 * pc.N, m, pc.N + n);
#else
    y[m * pc.N + n] = gather(pc.N, m, n);
#endif
#endif
}
