#version 450
// Cooperative-matrix (tensor core) matmul: partial[c, m, n] = sum over chunk c of K of
// W[n, k] * x[m, k], as 16 x 16 x 16 fp16 tiles with fp32 accumulation.
//
// x comes from split.comp: each row as fp16 hi and lo halves of the row times a power of two
// (hi + lo keeps 22 significant bits), so every tile is multiplied twice, W.hi then W.lo, and
// the product keeps near-fp32 accuracy; X_LO false (a specialization constant, kernels.Kernels'
// x_lo) takes hi alone: 11 significant bits, half the matrix work and half the x staging. W is fp16 in 16 x 16 tiles (W_T16: bf16 and fp16
// checkpoints, converted at upload by weights.py, exact in fp16's normal range, which holds every
// weight of a real checkpoint), or int8 / int4 codes (matmul.comp's W_I8 / W_I4 layout: codes,
// then scales, in one buffer; W_Q4 / W_Q5: min8.glsl's codes and side rows; W_T8: int8 codes in
// fragment-order tiles, matmul_coop_direct.comp's layout), dequantized while staged as fp16(code * scale (+ minimum)): the
// weight the CPU uses, rounded once more, to fp16 (a relative 2^-11, well inside the
// quantization's own error).
// fp16 tiles may be stored in fragment order (coop_fragment.glsl), and W_T8's always are: a staged
// piece is then a lane's 8 values of a tile (rows g and g + 8), which go into the stage's rows 4
// bytes at a time (W_T8 dequantized first), so every stage is row-major and coopMatLoad reads the
// A fragments from it. Building them from a stage kept in fragment order (fragment_of) was slower
// on the H200: the 4b labelling prefill (fp16) 27,120 against 28,091 tok/s, W_T8's prompt tile
// 10-27% (docs/EXPERIMENTS.md, "int8 weights in fragment-order tiles").
// For fp16 tiles, steps of up to the decode tiles' rows (coop_tiles.coop_decode_rows: 128 where every
// layer matrix has fp16 or int8 tiles, else 64) run matmul_coop_direct.comp instead (same sums,
// same order), so only this kernel's prefill tile is built for them.
//
// Sum order, the same for every M and every tile shape (batch invariance): K is cut into
// chunks of pc.kchunk; inside a chunk the 16-wide k blocks are accumulated in order; the chunks'
// sums are then added in chunk order. For M <= pc.fold_rows (decode steps, and prefill steps
// whose tiles alone would leave SMs idle: coop_tiles.coop_fold_rows) each chunk is its own
// workgroup (more workgroups streaming weights) and reduce.comp adds the chunks; above it
// a workgroup runs the chunks in order itself and writes their sum as chunk 0. Chunk c's rows
// start at c * M padded to 32 rows, whatever the tile (partial_rows.glsl).
//
// Tile: a workgroup owns BN = SG_N * TN * 16 outputs x BM = SG_M * TM * 16 rows; its
// SG_N * SG_M subgroups of 32 each own TN x TM tiles. Per stage of KU k (64, or 32 where a
// stage of 64 would not fit in shared memory), the workgroup copies W [BN, KU] and x hi/lo
// [BM, KU] to shared memory with 16-byte loads (the next stage's loads are issued before this
// stage's multiplies), then each subgroup multiplies its tiles.
// Rows past M read row M - 1 and are written only into the padding of partial (rows up to the
// tile's end); whole row tiles past M are skipped, their x neither loaded nor staged.
// Order of the prefill workgroups: the row tiles go in groups whose x rows (hi and lo) come to at
// most FOLD_GROUP_BYTES, and a group runs over every column tile before the next group starts,
// so its x stays in L2 while the weights stream (once per group). Row tiles fastest, as in decode
// steps, let x (168 MB of hi and lo at 4b's gate/up and 32 x 512 rows) leave L2 before the next
// column tile reads it again: 4b on the H100, a layer's four matmuls at 16,384 rows took 38.6 ms
// that way against 29.4-30.3 ms grouped (the 64 x 128 tile; docs/EXPERIMENTS.md, "Prefill tiles"). The order sets
// no sum: every tile's sums are its own.
//
// WHOLE_K (the prompt tile): rows from meta.prompt_start on (a step's prompt tokens, StepBatch),
// each output one sum over all of K in 16-wide k blocks in order, never in chunks; the other
// variants take the rows before it. So a prompt token's sums never depend on the step's size
// either, and the prompt tile holds no chunk totals beside its sums: 4b on the H100, the
// 8,192-token step's products 369 -> 222 ms (255 -> 128 registers; docs/EXPERIMENTS.md, "The
// prompt tile"). Where each kind's sums go: partial_rows.glsl.
//
// CHUNK_K (the chunk tile): the prefill tile where each K chunk is a workgroup of its own
// (chunked rows up to pc.fold_rows; the host runs the plain prefill tile above): it holds only
// its chunk's sum, no running total, so it fits the registers of the prompt tile (two workgroups
// an SM on the H100 where the chunk-order tile fits one). The same sums in the same order as the
// prefill tile's per-chunk workgroups, so the same bits.
//
// Variants: W_T16 | W_T8 | W_I8 | W_I4 | W_Q4 | W_Q5; GATED (N = 2 I: output columns [0, I) from W at binding 0, [I, 2 I)
// from the up weights at binding 4); ROWS (M = meta.num_rows: the LM head's gathered rows); the
// tile (SG_N, SG_M, TN, TM, KU; above the decode tiles' rows the host runs coop_tiles.COOP_FOLD_DEFINES'
// tile, or for fp16 tiles COOP_WIDE_DEFINES' (X_LO false) or COOP_WIDE_SPLIT_DEFINES' (X_LO true)).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "min8.glsl"

#ifndef SG_N
#define SG_N 4
#define SG_M 1
#define TN 1
#define TM 2
#endif
#define WG (32 * SG_N * SG_M)
#define BN (16 * SG_N * TN)     // coop_tiles.COOP_COLS, COOP_WIDE_COLS
#define BM (16 * SG_M * TM)
#ifndef KU
#define KU 64                   // k per stage (coop_tiles.COOP_KU; 32 for tiles whose stage would not fit)
#endif
#define XV (KU / 8)             // pieces of 8 (uvec4 of fp16) of a staged row
#define KBS (KU / 16)           // 16-wide k blocks per stage
#define FOLD_GROUP_BYTES (16u << 20)  // x bytes of a group of row tiles (prefill; see the header)
#define PAD (XV + 1)            // uvec4 per staged row: XV of data, 1 of padding against bank conflicts
layout(local_size_x = WG) in;
layout(constant_id = 0) const bool X_LO = true;  // x as hi + lo (true) or hi alone

#include "coop_stage_w.glsl"
layout(std430, binding = 0) readonly buffer Wb { WPIECE w4[]; };
layout(std430, binding = 1) readonly buffer Xb { uvec4 xs4[]; };   // split rows [hi K | lo K], fp16
layout(std430, binding = 2) writeonly buffer Pb { float part[]; };  // [chunks, Mpad, N]
layout(std430, binding = 4) readonly buffer W2b { WPIECE u4[]; };
// The scales of quantized weights, after the codes (aliases of bindings 0 and 4).
layout(std430, binding = 0) readonly buffer WSb { uint w_scales[]; };
layout(std430, binding = 4) readonly buffer W2Sb { uint u_scales[]; };
layout(push_constant) uniform Push {
    uint N;
    uint K;
    uint kchunk;   // K per chunk, a multiple of KU dividing K
    uint group;    // W_I4, W_Q4, W_Q5: weights per scale and minimum
    uint fold_rows;  // most rows whose chunks are workgroups of their own (above: summed in the workgroup)
} pc;

shared uvec4 wsh[BN * PAD];      // W stage [BN rows][KU k] as fp16
shared uvec4 xsh[(X_LO ? 2 : 1) * BM * PAD];  // x stage: hi rows, then lo rows (X_LO)

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#include "coop_fragment.glsl"
#include "partial_rows.glsl"
#define X_LOADS (2 * BM * XV / WG)   // uvec4 of x per invocation per stage

void main() {
    // This dispatch's rows [row0, M) (partial_rows.glsl).
#ifdef WHOLE_K
    uint row0 = meta.prompt_start, M = meta.num_tokens;
    bool fold = true;  // one workgroup over all of K, no chunks
#elif defined(CHUNK_K)
    uint row0 = 0u, M = chunked_rows();
    bool fold = false;  // only run where M <= pc.fold_rows: each chunk a workgroup
#else
    uint row0 = 0u, M = chunked_rows();
    bool fold = M > pc.fold_rows;
#endif
    uint m_groups = (M - row0 + BM - 1) / BM, n_groups = pc.N / BN, chunks = pc.K / pc.kchunk;
    uint id = linear_group();
    if (id >= m_groups * n_groups * (fold ? 1u : chunks)) return;
    // Row tiles fastest (neighbouring workgroups share W rows: they stay in cache), in groups of at
    // most `most` row tiles, a group over every column tile before the next (see the header; decode
    // steps: one group).
    uint tile = id % (m_groups * n_groups), c_first = fold ? 0u : id / (m_groups * n_groups);
    uint most = fold ? max(1u, FOLD_GROUP_BYTES / (BM * pc.K * (X_LO ? 4u : 2u))) : m_groups;
    uint first = (tile / (most * n_groups)) * most, rest = tile - first * n_groups, size = min(most, m_groups - first);
    uint m0 = row0 + (first + rest % size) * BM;
    uint n0 = (rest / size) * BN;
    uint k_begin = c_first * pc.kchunk, k_end = fold ? pc.K : k_begin + pc.kchunk;
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    uint sg_n = sg % SG_N, sg_m = sg / SG_N;
    uint K8 = pc.K / 8, xrow = pc.K / 4;  // pieces of 8 per W row, uvec4 per split x row
#ifdef GATED
    bool up = n0 >= pc.N / 2;
    uint wrow0 = up ? n0 - pc.N / 2 : n0;
#else
    bool up = false;
    uint wrow0 = n0;
#endif
    // Which of this subgroup's row tiles hold rows below M (uniform per subgroup).
    uint live_tm = min(TM, (M - min(M, m0 + sg_m * TM * 16) + 15) / 16);
    uint live_rows = min(BM, (M - m0 + 15) / 16 * 16);  // the stage's x rows any subgroup multiplies

    // Quantized W: where the scales start (words), and the (scale, minimum) of each staged piece:
    // int8's scale per INT8_GROUP (fp16 halves), int4's pair per pc.group (a word); W_T8: piece e
    // is lane e % 32 of the stage's tile e / 32, its rows' two scales one word
    // (matmul_coop_direct.comp).
#ifdef GATED
    uint scale_base = (pc.N / 2) * (pc.K / 8) * (W_BYTES_PER_8 / 4);
#else
    uint scale_base = pc.N * (pc.K / 8) * (W_BYTES_PER_8 / 4);
#endif
    vec2 wsc[W_LOADS];
    [[unroll]] for (uint i = 0; i < W_LOADS; i++) wsc[i] = vec2(1.0, 0.0);
#if defined(W_Q4) || defined(W_Q5)
    vec2 qstep[W_LOADS];  // the steps of each staged piece's row, the same at every stage: read once
    [[unroll]] for (uint i = 0; i < W_LOADS; i++) {
        uint row_ = Q_SIDE_ROW(tid + WG * i);
        qstep[i] = unpackHalf2x16(up ? u_scales[row_] : w_scales[row_]);
    }
#endif
    uint whigh[W_LOADS];  // W_Q5: each staged piece's fifth bits (a byte per 8 weights, from the low bits)
#ifdef W_Q5
#define LOAD_HIGH(i, at, k8) whigh[i] = (up ? u_scales[at] : w_scales[at]) >> (8u * ((k8) & 3u));
#else
#define LOAD_HIGH(i, at, k8)
    [[unroll]] for (uint i = 0; i < W_LOADS; i++) whigh[i] = 0u;
#endif

    WPIECE wr[W_LOADS];
    uvec4 xr[X_LOADS];
#define LOAD_STAGE(k0) { \
        [[unroll]] for (uint i = 0; i < W_LOADS; i++) { \
            uint e = tid + WG * i, at = W_AT(e, k0); \
            if (up) wr[i] = u4[at]; else wr[i] = w4[at]; \
            LOAD_SCALE(i, e, k0); \
        } \
        [[unroll]] for (uint i = 0; i < X_LOADS; i++) { \
            uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2; \
            if (row < live_rows && (X_LO || half_ == 0u)) xr[i] = xs4[min(m0 + row, M - 1) * xrow + half_ * K8 + (k0) / 8 + e % XV]; \
        } }

    ACC acc[TN * TM];  // tile (tn, tm) at tn * TM + tm
#if defined(WHOLE_K) || defined(CHUNK_K)
#define total acc
    [[unroll]] for (uint i = 0; i < TN * TM; i++) acc[i] = ACC(0.0);
#else
    ACC total[TN * TM];  // the chunks' sum so far
    [[unroll]] for (uint i = 0; i < TN * TM; i++) { acc[i] = ACC(0.0); total[i] = ACC(0.0); }
#endif
    LOAD_STAGE(k_begin);
    for (uint k0 = k_begin; k0 < k_end; k0 += KU) {
        barrier();  // the last stage's multiplies are done with shared memory
        [[unroll]] for (uint i = 0; i < W_LOADS; i++) {
            uint e = tid + WG * i;
#ifdef W_4BIT
            [[unroll]] for (uint j = 0; j < WORDS; j++) wsh[W_SH(e) + j] = to_fp16(WORD(wr[i], j), wsc[i], whigh[i] >> (8u * j));
#else
            uvec4 h = to_fp16(wr[i], wsc[i], whigh[i]);
#if defined(W_T16) || defined(W_T8)
            if (PIECE_FRAGMENTS) {  // lane l = 4 g + t of stage tile e / 32: rows g, g + 8; columns 2t, 2t + 1 and 2t + 8, 2t + 9
                uint tile_ = e / 32, at_ = ((tile_ / KBS) * 16 + (e % 32) / 4) * PAD + (tile_ % KBS) * 2, t_ = e % 4;
                wsh[at_][t_] = h.x; wsh[at_ + 1][t_] = h.y; wsh[at_ + 8 * PAD][t_] = h.z; wsh[at_ + 8 * PAD + 1][t_] = h.w;
            } else
#endif
            wsh[W_SH(e)] = h;
#endif
        }
        [[unroll]] for (uint i = 0; i < X_LOADS; i++) {
            uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2;
            if (row < live_rows && (X_LO || half_ == 0u)) xsh[(half_ * BM + row) * PAD + e % XV] = xr[i];
        }
        barrier();
        if (k0 + KU < k_end) LOAD_STAGE(k0 + KU);  // in flight during the multiplies
        [[unroll]] for (uint j = 0; j < KU / 16; j++) {
            MAT_A a[TN];
            [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                coopMatLoad(a[tn], wsh, ((sg_n * TN + tn) * 16) * PAD + 2 * j, PAD, gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                if (tm >= live_tm) break;
                uint r = (sg_m * TM + tm) * 16;
                MAT_B hi;
                coopMatLoad(hi, xsh, r * PAD + 2 * j, PAD, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM + tm] = coopMatMulAdd(a[tn], hi, acc[tn * TM + tm]);
                if (X_LO) {
                    MAT_B lo;
                    coopMatLoad(lo, xsh, (BM + r) * PAD + 2 * j, PAD, gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint tn = 0; tn < TN; tn++) acc[tn * TM + tm] = coopMatMulAdd(a[tn], lo, acc[tn * TM + tm]);
                }
            }
        }
#if !defined(WHOLE_K) && !defined(CHUNK_K)
        uint done = k0 + KU - k_begin;
        if (done % pc.kchunk == 0) {  // a chunk ends: add its sum to the running total, in chunk order
            [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                    if (done == pc.kchunk) total[tn * TM + tm] = acc[tn * TM + tm];
                    else total[tn * TM + tm] = total[tn * TM + tm] + acc[tn * TM + tm];
                    acc[tn * TM + tm] = ACC(0.0);
                }
            }
        }
#endif
    }
#ifdef WHOLE_K
    uint base = (partial_row(row0, row0, chunks) - row0) * pc.N;  // row m at partial_row(m)
#else
    uint base = (fold ? 0u : c_first) * chunk_slot_rows(M) * pc.N;
#endif
    [[unroll]] for (uint tn = 0; tn < TN; tn++) {
        [[unroll]] for (uint tm = 0; tm < TM; tm++) {
            if (tm >= live_tm) break;
            uint m = m0 + (sg_m * TM + tm) * 16, n = n0 + (sg_n * TN + tn) * 16;
            // the tile is y^T (n, m): column-major with stride N puts (n, m) at m * N + n
            coopMatStore(total[tn * TM + tm], part, base + m * pc.N + n, pc.N, gl_CooperativeMatrixLayoutColumnMajor);
        }
    }
}
