#version 450
// Decode matmul on the matrix units, weights loaded straight into matrix registers:
// partial[c, m, n] = sum over chunk c of K of W[n, k] * x[m, k], for steps of up to coop_tiles.coop_decode_rows
// rows (128 where every layer matrix on the path has fp16 or int8 tiles, else 64).
//
// W is fp16 in 16 x 16 tiles (weights.py: tile (nt, kt) is the 512 contiguous bytes at
// (nt * K / 16 + kt) * 256 halves, rows of 16 halves, or in fragment order: coop_fragment.glsl),
// so each tile is one coalesced load into the A operand, with no shared memory and no barrier
// between the load and the multiply (in fragment order one 16-byte load a lane; coopMatLoad of a
// row-major tile is four 4-byte loads a lane on the H100's driver); or (W_T8) int8 codes in 16 x 16
// tiles in fragment order, 8 bytes a lane, with the scales of the lane's two rows in one word
// (fragment_order.int8_tiles), dequantized in registers as matmul_coop.comp's W_I8 staging does
// (fp16(code * scale), clamped: the same values, so the same sums); a
// subgroup holds the next stage's tiles in flight while it multiplies this one's. x (split.comp's
// fp16 hi and lo rows) goes through shared memory one stage at a time, read from L2 into
// registers a stage ahead as well (its load latency is then hidden behind the multiplies).
//
// The sums are matmul_coop.comp's, in its order (the prefill tile of the same weights runs there,
// W_T16): per chunk, for each 16-wide k block in order, acc += W.hi then acc += W.lo; chunk c is
// workgroup c's, and reduce.comp adds the chunks in order. X_LO false (kernels.Kernels' x_lo):
// x's hi halves only, neither staged nor multiplied lo.
//
// Tile: a workgroup owns BN = 128 outputs (4 subgroups of 2 x 16) x BM = 32 rows; a subgroup
// whose outputs lie past N only helps stage x. Rows past M read row M - 1 and are written only
// into the padding of partial; row tiles past M are skipped.
// Variants: W_T16 (the default) | W_T8; GATED (N = 2 I: outputs [0, I) from W at binding 0, [I, 2 I) from binding 4; I is a
// multiple of 32, so a subgroup's outputs are all gate or all up); ROWS (M = meta.num_rows); with
// ROWS, Y_OUT (a matrix of one K chunk: the LM head): y[m, n] = sum * scale[m] into binding 2 [M, N]
// itself, as reduce.comp's ROWS would write it (a chunk's sum times a power of two: the same bits),
// through shared memory a tile at a time, rows past M not at all, so no reduce follows.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

#define SG_N 4
#define TN 2                    // 16-output tiles per subgroup
#define TM 2                    // 16-row tiles per workgroup
#define KS 4                    // 16-wide k blocks per stage (64 k: coop_tiles.COOP_KU)
#define WG (32 * SG_N)
#define BN (16 * SG_N * TN)     // coop_tiles.COOP_DIRECT_COLS
#define BM (16 * TM)            // coop_tiles.COOP_ROWS
#define XV (2 * KS)             // uvec4 of one x row per stage
#define PAD (XV + 1)            // against bank conflicts
#define X_LOADS (2 * BM * XV / WG)
layout(local_size_x = WG) in;
layout(constant_id = 0) const bool X_LO = true;  // matmul_coop.comp's switch

layout(std430, binding = 0) readonly buffer Wb { uvec4 w4[]; };   // fp16 tiles, 32 uvec4 each
layout(std430, binding = 1) readonly buffer Xb { uvec4 xs4[]; };  // split rows [hi K | lo K], fp16
layout(std430, binding = 2) writeonly buffer Pb { float part[]; };  // [chunks, Mpad, N]
#ifdef Y_OUT
layout(std430, binding = 2) writeonly buffer Yb { vec4 y4[]; };  // [M, N]: the logits
layout(std430, binding = 5) readonly buffer Sb { float scale[]; };  // split.comp's, a row
#endif
layout(std430, binding = 4) readonly buffer W2b { uvec4 u4[]; };
#ifdef W_T8  // codes [N / 16, K / 16] tiles of 32 uvec2, then the scales' words [N / 16, 8, K / 32] (aliases)
layout(std430, binding = 0) readonly buffer W8b { uvec2 w8[]; };
layout(std430, binding = 4) readonly buffer U8b { uvec2 u8[]; };
layout(std430, binding = 0) readonly buffer WSb { uint w_scales[]; };
layout(std430, binding = 4) readonly buffer USb { uint u_scales[]; };
#endif
layout(push_constant) uniform Push {
    uint N;
    uint K;
    uint kchunk;   // K per chunk, a multiple of 16 KS dividing K
    uint group;    // unused (matmul_coop.comp's push layout)
    uint fold_rows;  // unused: at its sizes every chunk is a workgroup
} pc;

shared uvec4 xsh[2 * BM * PAD];  // x stage: hi rows, then lo rows

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#include "coop_fragment.glsl"
#include "partial_rows.glsl"

void main() {
    uint M = chunked_rows();  // the rows before the step's prompt tokens (partial_rows.glsl)
    uint m_groups = (M + BM - 1) / BM, n_groups = (pc.N + BN - 1) / BN, chunks = pc.K / pc.kchunk;
    // A workgroup per (chunk, row tile, column tile), or fewer looping over them (the LM head's
    // grid is capped at a few workgroups per SM, grids.py: no last partial wave).
    uint total = m_groups * n_groups * chunks, stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    for (uint id = linear_group(); id < total; id += stride) {
        // K chunks fastest, then row tiles: neighbouring workgroups read neighbouring K ranges of the
        // same weight rows (4b on the H100, median step 5.36-5.38 against 5.41 ms at batch 1, 6.40-6.42
        // against 6.41-6.45 at 32, with column tiles after row tiles and chunks last; the journal, `git show 4d73df3:docs/PERFORMANCE.md`).
        uint c = id % chunks;
        uint m0 = ((id / chunks) % m_groups) * BM;
        uint n0 = (id / (chunks * m_groups)) * BN + gl_SubgroupID * TN * 16;  // this subgroup's first output
        uint tid = gl_LocalInvocationID.x;
        uint K8 = pc.K / 8, KB = pc.K / 16, xrow = pc.K / 4;  // uvec4 per hi (or lo) row, k blocks, uvec4 per split row
        bool live = n0 < pc.N;
#ifdef GATED
        bool up = n0 >= pc.N / 2;
        uint tile0 = ((up ? n0 - pc.N / 2 : n0) / 16) * KB;  // tile index of (first output, k = 0)
#else
        bool up = false;
        uint tile0 = (n0 / 16) * KB;
#endif
        uint live_tm = min(TM, (M - min(M, m0) + 15) / 16), live_rows = 16 * live_tm;

        ACC acc[TN * TM];  // tile (tn, tm) at tn * TM + tm
        [[unroll]] for (uint i = 0; i < TN * TM; i++) acc[i] = ACC(0.0);
        // The stage's W tiles (k block u, output tile tn) at u * TN + tn: a lane's 16 bytes of each
        // (FRAGMENT_LOADS), or the fragments coopMatLoad read. One branch on `up` a stage, not a
        // select a load: gate/up's kernel then fits 128 registers (139 with a select a load).
#ifdef W_T8
        // A lane's 8 codes of each tile, and per output tile and 32-k group of the stage the word
        // of its rows' scales (lane l = 4 g + t: rows g and g + 8, fragment_order.py).
        uvec2 wq[KS * TN];
        uint wsw[TN * KS / 2];
        uint kg = pc.K / 32, scale_base = ((tile0 / KB) * 8 + gl_SubgroupInvocationID / 4) * kg;
#ifdef GATED
        scale_base += (pc.N / 2) * pc.K / 4;  // (words of the codes)
#else
        scale_base += pc.N * pc.K / 4;
#endif
#define LOAD_TILES(buf, sbuf, kb) [[unroll]] for (uint u = 0; u < KS; u++) [[unroll]] for (uint tn = 0; tn < TN; tn++) { \
            wq[u * TN + tn] = buf[(tile0 + tn * KB + (kb) + u) * 32 + gl_SubgroupInvocationID]; \
            if (u % 2 == 0) wsw[tn * KS / 2 + u / 2] = sbuf[scale_base + tn * 8 * kg + ((kb) + u) / 2]; }
#define LOAD_W(kb) if (up) { LOAD_TILES(u8, u_scales, kb) } else { LOAD_TILES(w8, w_scales, kb) }
#else
        uvec4 wf[KS * TN];
        MAT_A wm[KS * TN];
#define LOAD_TILES(buf, kb) [[unroll]] for (uint u = 0; u < KS; u++) [[unroll]] for (uint tn = 0; tn < TN; tn++) { \
            uint at_ = (tile0 + tn * KB + (kb) + u) * 32; \
            if (FRAGMENT_LOADS) wf[u * TN + tn] = buf[at_ + gl_SubgroupInvocationID]; \
            else coopMatLoad(wm[u * TN + tn], buf, at_, 2, gl_CooperativeMatrixLayoutRowMajor); }
#define LOAD_W(kb) if (up) { LOAD_TILES(u4, kb) } else { LOAD_TILES(w4, kb) }
#endif
        uint kb0 = c * (pc.kchunk / 16), kb1 = kb0 + pc.kchunk / 16;
        uvec4 xr[X_LOADS];
#define LOAD_X(kb) [[unroll]] for (uint i = 0; i < X_LOADS; i++) { \
            uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2; \
            if (row < live_rows && (X_LO || half_ == 0u)) xr[i] = xs4[min(m0 + row, M - 1) * xrow + half_ * K8 + 2 * (kb) + e % XV]; }
        if (live) LOAD_W(kb0);
        LOAD_X(kb0);
        for (uint kb = kb0; kb < kb1; kb += KS) {
            barrier();  // the last stage's multiplies are done with shared memory
            [[unroll]] for (uint i = 0; i < X_LOADS; i++) {
                uint e = tid + WG * i, row = e / (2 * XV), half_ = (e / XV) % 2;
                if (row < live_rows && (X_LO || half_ == 0u)) xsh[(half_ * BM + row) * PAD + e % XV] = xr[i];
            }
            barrier();
            if (kb + KS < kb1) LOAD_X(kb + KS);  // the next stage's x in flight during the multiplies
            if (live) {  // (no early exit: every subgroup takes part in the next stage's barriers)
                MAT_A cur[KS * TN];
#ifdef W_T8
                [[unroll]] for (uint u = 0; u < KS; u++) [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                    vec2 s = unpackHalf2x16(wsw[tn * KS / 2 + u / 2]);  // rows g, g + 8
                    cur[u * TN + tn] = fragment_of(int8_fp16_8(wq[u * TN + tn], s));
                }
#else
                [[unroll]] for (uint i = 0; i < KS * TN; i++) cur[i] = FRAGMENT_LOADS ? fragment_of(wf[i]) : wm[i];
#endif
                if (kb + KS < kb1) LOAD_W(kb + KS);  // in flight during the multiplies
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
#ifdef Y_OUT
        // Each subgroup stages its tiles in its own 1 KiB of the x stage, once every subgroup is done
        // multiplying: (n, m) at m * 16 + n floats; then a lane writes 8 outputs of one row.
        barrier();
        if (live) {
            uint at = gl_SubgroupID * 64u, lane = gl_SubgroupInvocationID, ml = lane / 2u, nl = (lane % 2u) * 8u;
            [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                    if (tm >= live_tm) break;
                    coopMatStore(acc[tn * TM + tm], xsh, at, 4, gl_CooperativeMatrixLayoutColumnMajor);
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    uint m = m0 + tm * 16u + ml;
                    uvec4 a = xsh[at + ml * 4u + nl / 4u], b = xsh[at + ml * 4u + nl / 4u + 1u];
                    if (m < M) {
                        uint o = (m * pc.N + n0 + tn * 16u + nl) / 4u;
                        y4[o] = uintBitsToFloat(a) * scale[m];
                        y4[o + 1u] = uintBitsToFloat(b) * scale[m];
                    }
                    subgroupBarrier();  // read before the next tile's store
                }
            }
        }
#else
        if (live) {
            uint base = c * m_groups * BM * pc.N;
            [[unroll]] for (uint tn = 0; tn < TN; tn++) {
                [[unroll]] for (uint tm = 0; tm < TM; tm++) {
                    if (tm >= live_tm) break;
                    // the tile is y^T (n, m): column-major with stride N puts (n, m) at m * N + n
                    coopMatStore(acc[tn * TM + tm], part, base + (m0 + tm * 16) * pc.N + n0 + tn * 16, pc.N,
                                 gl_CooperativeMatrixLayoutColumnMajor);
                }
            }
        }
#endif
    }  // the next tile's first barrier waits for this one's multiplies (and reads of its staged outputs)
}
