#version 450
// Prefill attention on the matrix units (flash attention): the prompt tokens of a step, a
// workgroup per (tile of up to TQ consecutive prompt tokens of one sequence, kv head j), S = Q.K^T
// and O += P.V as 16 x 16 x 16 fp16 products with fp32 sums (VK_KHR_cooperative_matrix), an
// online softmax in fp32 between them. attention.comp serves every other token (decode tokens,
// and generated tokens recomputed after a preemption): which kernel runs a token depends only on
// whether its position is below its sequence's prompt length (StepBatch.prompt_lens), never on
// the batch.
//
// Rows: the tile's (token i, query head g of kv head j) pairs, row r = i G + g, BM = 64 of them
// (TQ = 64 / G tokens); 8 subgroups of 32. Q is read once (times the scale, rounded to fp16) and
// each subgroup keeps the A fragments of its 16 rows in registers. Keys go in blocks of BK = 32
// absolute positions (block b: [b BK, (b + 1) BK)), from the block of the first token's window
// start to the block of the last token; per block:
//   stage   K and V rows of the block into shared memory as fp16 (zeros for keys outside
//           [lo of the tile's first token, last token's position]); the next block's rows are
//           loaded into registers during this block's P.V
//   S       [64, 32] = Q.K^T, a 16 x 16 tile per subgroup, over head_dim in 16-wide steps, to shared
//   softmax 4 invocations per row, 8 keys each: keys outside the row's [lo, p] masked; the row's
//           running max m, the block's probabilities P = exp(s - m) (fp16, to shared), their sum
//           (each invocation's 8 in key order, then a 2-step xor butterfly) into the running sum
//           l, and the factor e^(m_old - m) of what came before
//   P.V     each subgroup rescales its output tiles (16 rows x head_dim / 2) and adds P.V
// then O / l is written to attn [T, nh, hd]. Batch invariance: a row's arithmetic depends only on
// its own query, position and keys: the blocks are fixed by absolute positions, and a block in
// which the row sees no key leaves m, l and O exactly as they were (the max of masked scores
// is -inf, P = 0, the factor 1); each product's sums run in the same order in every tile. So a
// token's output is bit-identical however the prompt is cut into steps and tiles.
// The accumulators' element -> (row, column) map, which VK_KHR_cooperative_matrix leaves to the
// device, is read once per workgroup from a matrix of known values.
//
// Variants: KV_F16 | KV_BF16 | KV_F32 | KV_I8 (the page storage, kv_rows.glsl). Specialization
// constants 7-9 (push_constants.SPECIALIZED): head_dim (a multiple of 32 up to 256), num_heads,
// num_kv_heads (64 a multiple of G); flash.py decides where the kernel runs.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "kv_pages.glsl"
#define PAGE_ACCESS readonly
#include "kv_rows.glsl"

#define SUBGROUPS 8
#define WG (32 * SUBGROUPS)
#define BM 64           // query rows per workgroup (flash.py: FLASH_ROWS)
#define BK 32           // keys per block
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Qb { vec4 q4[]; };       // [T, nh, hd]
layout(std430, binding = 1) writeonly buffer Ob { float o[]; };      // [T, nh, hd]
layout(std430, binding = 2) readonly buffer Pb { int positions[]; };
layout(std430, binding = 3) readonly buffer TLb { ivec4 tiles[]; };  // (first token, tokens, sequence, 0)
layout(std430, binding = 4) readonly buffer Tb { int block_table[]; };

layout(push_constant) uniform Push {
    uint num_heads;
    uint num_kv_heads;
    uint head_dim;
    uint window;        // 0: global layer
    uint block_size;
    uint table_stride;  // block-table entries per sequence
    float scale;        // query_pre_attn_scalar ** -0.5
} pc;
layout(constant_id = 7) const uint HD = 256u;
layout(constant_id = 8) const uint NH = 8u;
layout(constant_id = 9) const uint NKV = 4u;
const uint G = NH / NKV;
const uint HD8 = HD / 8u;         // pieces of 8 per row
const uint HDT = HD / 16u;        // 16-wide column tiles of a head
const uint OT = HDT / 2u;         // output column tiles per subgroup
const uint RS = HD8 + 1u;         // uvec4 per staged K, V or Q row (one of padding against bank conflicts)
const uint PRS = BK / 8u + 1u;    // uvec4 per staged row of P
const uint SRS = BK + 4u;         // floats per staged row of S
const uint KV_LOADS = (BK * HD8 + WG - 1u) / WG;  // pieces of K (and of V) per invocation per block
const float NEG = -1.0e30;

shared uvec4 kv_sh[2u * BK * RS];  // the block's K rows, then its V rows (first: the Q tile's 64 rows)
shared float s_sh[BM * SRS];       // S of the block (first: the element map's probe)
shared uvec4 p_sh[BM * PRS];       // P of the block, fp16
shared float factor_sh[BM];        // e^(m_old - m) of the block, then 1 / l

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define EL 8u  // accumulator elements per invocation (16 x 16 over 32 invocations)

uvec4 half8(vec4 lo, vec4 hi) {  // 8 values as fp16, clamped into its range
    lo = clamp(lo, vec4(-65504.0), vec4(65504.0));
    hi = clamp(hi, vec4(-65504.0), vec4(65504.0));
    return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}

void main() {
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    uint id = linear_group();
    uint j = id % NKV;
    ivec4 tile = tiles[id / NKV];
    uint t0 = uint(tile.x), n = uint(tile.y), table = uint(tile.z) * pc.table_stride;
    uint hd = HD, hd8 = HD8;  // (LOAD8)
    uint p0 = uint(positions[t0]), p_last = p0 + n - 1u;
    uint lo0 = pc.window == 0u ? 0u : uint(max(0, int(p0) - int(pc.window) + 1));
    uint rt = sg % 4u, half_ = sg / 4u;  // this subgroup's row tile; S: its key tile, P.V: its half of the columns

    // The element map: the probe's element e holds 16 row + column.
    for (uint e = tid; e < 256u; e += WG) s_sh[(e / 16u) * SRS + e % 16u] = float(e);
    // The Q tile, scaled, as fp16 rows (row r = i G + g; rows past the tile's tokens are zeros).
    for (uint e = tid; e < BM * HD8; e += WG) {
        uint r = e / HD8, piece = e % HD8, i = r / G;
        uvec4 v = uvec4(0u);
        if (i < n) {
            uint at = ((t0 + i) * NH + j * G + r % G) * (HD / 4u) + 2u * piece;
            v = half8(q4[at] * pc.scale, q4[at + 1u] * pc.scale);
        }
        kv_sh[r * RS + piece] = v;
    }
    barrier();
    ACC probe;
    coopMatLoad(probe, s_sh, 0, SRS, gl_CooperativeMatrixLayoutRowMajor);
    uint row_of[EL], col_of[EL];
    [[unroll]] for (uint e = 0u; e < EL; e++) {
        uint v = e < uint(probe.length()) ? uint(probe[e]) : 0u;
        row_of[e] = rt * 16u + v / 16u;
        col_of[e] = v % 16u;
    }
    MAT_A qa[HDT];
    [[unroll]] for (uint d = 0u; d < HDT; d++)
        coopMatLoad(qa[d], kv_sh, rt * 16u * RS + 2u * d, RS, gl_CooperativeMatrixLayoutRowMajor);
    ACC acc[OT];
    [[unroll]] for (uint c = 0u; c < OT; c++) acc[c] = ACC(0.0);

    // Softmax roles: row sr, keys 8 spart .. 8 spart + 7 of the block.
    uint sr = tid / 4u, spart = tid % 4u, si = sr / G;
    uint sp = p0 + si;  // the row's position (rows past the tile: masked everywhere)
    uint slo = pc.window == 0u ? 0u : uint(max(0, int(sp) - int(pc.window) + 1));
    bool live = si < n;
    float m = NEG, l = 0.0;

    uint first = lo0 / BK, last = p_last / BK;
    uvec4 kr[KV_LOADS], vr[KV_LOADS];
#define LOAD_BLOCK(b) { \
        [[unroll]] for (uint i = 0u; i < KV_LOADS; i++) { \
            uint e = tid + WG * i, key = (b) * BK + e / HD8, piece = e % HD8; \
            kr[i] = uvec4(0u); vr[i] = uvec4(0u); \
            if (e < BK * HD8 && key >= lo0 && key <= p_last) { \
                uint row = (uint(block_table[table + key / pc.block_size]) * pc.block_size + key % pc.block_size) * NKV + j; \
                vec4 a, c; \
                LOAD8(k4, row, piece, a, c); kr[i] = half8(a, c); \
                LOAD8(v4, row, piece, a, c); vr[i] = half8(a, c); \
            } \
        } }
    LOAD_BLOCK(first);
    barrier();  // (every subgroup has its Q fragments: kv_sh takes K and V now)
    for (uint b = first; b <= last; b++) {
        [[unroll]] for (uint i = 0u; i < KV_LOADS; i++) {
            uint e = tid + WG * i, k = e / HD8, piece = e % HD8;
            if (e >= BK * HD8) break;
            kv_sh[k * RS + piece] = kr[i];
            kv_sh[(BK + k) * RS + piece] = vr[i];
        }
        barrier();
        // S tile (row tile rt, keys 16 half_ ..): K^T's 16 x 16 blocks are K rows read column-major.
        ACC s = ACC(0.0);
        [[unroll]] for (uint d = 0u; d < HDT; d++) {
            MAT_B kb;
            coopMatLoad(kb, kv_sh, half_ * 16u * RS + 2u * d, RS, gl_CooperativeMatrixLayoutColumnMajor);
            s = coopMatMulAdd(qa[d], kb, s);
        }
        coopMatStore(s, s_sh, rt * 16u * SRS + half_ * 16u, SRS, gl_CooperativeMatrixLayoutRowMajor);
        barrier();
        // Online softmax of row sr over keys 8 spart ..
        {
            float v[8];
            float mx = -1.0 / 0.0;
            [[unroll]] for (uint k = 0u; k < 8u; k++) {
                uint key = b * BK + 8u * spart + k;
                bool seen = live && key >= slo && key <= sp;
                v[k] = seen ? s_sh[sr * SRS + 8u * spart + k] : -1.0 / 0.0;
                mx = max(mx, v[k]);
            }
            mx = max(mx, subgroupShuffleXor(mx, 1u));
            mx = max(mx, subgroupShuffleXor(mx, 2u));
            float m_new = max(m, mx);
            float sum = 0.0;
            [[unroll]] for (uint k = 0u; k < 8u; k++) {
                v[k] = v[k] == -1.0 / 0.0 ? 0.0 : exp(v[k] - m_new);
                sum += v[k];
            }
            sum += subgroupShuffleXor(sum, 1u);
            sum += subgroupShuffleXor(sum, 2u);
            float f = m_new == m ? 1.0 : exp(m - m_new);
            l = l * f + sum;
            m = m_new;
            p_sh[sr * PRS + spart] = half8(vec4(v[0], v[1], v[2], v[3]), vec4(v[4], v[5], v[6], v[7]));
            if (spart == 0u) factor_sh[sr] = f;
        }
        barrier();
        if (b < last) LOAD_BLOCK(b + 1u);  // in flight during the products
        MAT_A pa0;  // (one declaration each: glslang mistypes the second of a list)
        MAT_A pa1;
        coopMatLoad(pa0, p_sh, rt * 16u * PRS, PRS, gl_CooperativeMatrixLayoutRowMajor);
        coopMatLoad(pa1, p_sh, rt * 16u * PRS + 2u, PRS, gl_CooperativeMatrixLayoutRowMajor);
        float f[EL];
        [[unroll]] for (uint e = 0u; e < EL; e++) f[e] = factor_sh[row_of[e]];
        [[unroll]] for (uint c = 0u; c < OT; c++) {
            [[unroll]] for (uint e = 0u; e < EL; e++)
                if (e < uint(acc[c].length())) acc[c][e] *= f[e];
            uint col = (half_ * OT + c) * 2u;  // uvec4 offset of the column tile
            MAT_B vb0;
            MAT_B vb1;
            coopMatLoad(vb0, kv_sh, BK * RS + col, RS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(vb1, kv_sh, (BK + 16u) * RS + col, RS, gl_CooperativeMatrixLayoutRowMajor);
            acc[c] = coopMatMulAdd(pa0, vb0, acc[c]);
            acc[c] = coopMatMulAdd(pa1, vb1, acc[c]);
        }
        barrier();  // kv_sh, p_sh and factor_sh are the next block's
    }

    if (spart == 0u) factor_sh[sr] = live ? 1.0 / l : 0.0;
    barrier();
    [[unroll]] for (uint c = 0u; c < OT; c++) {
        [[unroll]] for (uint e = 0u; e < EL; e++) {
            uint r = row_of[e], i = r / G, col = (half_ * OT + c) * 16u + col_of[e];
            if (e < uint(acc[c].length()) && i < n)
                o[((t0 + i) * NH + j * G + r % G) * HD + col] = acc[c][e] * factor_sh[r];
        }
    }
}
