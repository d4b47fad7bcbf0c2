#version 450
// C [M, N] fp32 = A [M, K] fp16 . B [N, K]^T fp16 on VK_NV_cooperative_matrix2 workgroup-scope
// matrices loaded with tensor addressing (coopMatLoadTensorNV): no application shared memory, the
// driver stages the loads. A workgroup of WG invocations owns one BM x BN tile of C; per step of
// BK it loads A [BM, BK] and B as a BK x BN matrix through a transpose view of the K-contiguous
// rows of B [N, K], and multiply-adds into an fp32 BM x BN accumulator; the K loop is unrolled
// UNROLL steps at a time (then single steps for what is left), and C is stored with a tensor store.
//
// Assumes M % BM == 0, N % BN == 0, K % BK == 0 and K % 8 == 0, N % 4 == 0 (16-byte aligned rows):
// every layout uses clamp mode Undefined (the unclamped fast path only; no edge tiles).
// Bindings 0, 1, 2 = A, B, C; push constants M, N, K, pad (as benchmarks/gemm_coop.comp).
//
// Defines: WG (128/256), BM, BN, BK; UNROLL (default 8); GM > 0 groups the tile order GM tiles
// along M at a time (grouped rasterization, for L2 reuse); GM = 0 (default): tile index
// x = ic * blocks_m + ir, M fastest (as ggml's mul_mm_cm2 orders its x / y grid). SPEC_MNK: M, N, K
// come from specialization constants 0, 1, 2 instead of the push constants (known to the driver's
// compiler when it builds the pipeline, as in NVIDIA's vk_cooperative_matrix_perf sample).
// Build: python .exp/cm2/build.py (SPIR-V 1.6, i.e. --target-env vulkan1.3).
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable

#ifndef WG
#define WG 256
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 64
#endif
#ifndef UNROLL
#define UNROLL 8
#endif
#ifndef GM
#define GM 0
#endif

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer Ab { float16_t a[]; };
layout(std430, binding = 1) readonly buffer Bb { float16_t b[]; };
layout(std430, binding = 2) writeonly buffer Cb { float c[]; };
layout(push_constant) uniform Push { uint M; uint N; uint K; uint pad; } pc;
#ifdef SPEC_MNK
layout(constant_id = 0) const uint SPEC_M = 1;
layout(constant_id = 1) const uint SPEC_N = 1;
layout(constant_id = 2) const uint SPEC_K = 1;
#define P_M SPEC_M
#define P_N SPEC_N
#define P_K SPEC_K
#else
#define P_M pc.M
#define P_N pc.N
#define P_K pc.K
#endif

#define MAT_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>

void main() {
    const uint blocks_m = P_M / BM;
    const uint blocks_n = P_N / BN;
    const uint tile = gl_WorkGroupID.x;
    uint ir, ic;  // tile row (M) and column (N)
#if GM > 0
    const uint per_group = GM * blocks_n;
    const uint first_m = (tile / per_group) * GM;
    const uint rows_here = min(blocks_m - first_m, uint(GM));
    const uint in_group = tile % per_group;
    ir = first_m + in_group % rows_here;
    ic = in_group / rows_here;
#else
    ir = tile % blocks_m;
    ic = tile / blocks_m;
#endif

    // Strides with their low bits cleared: tells the compiler rows start 16-byte aligned (the
    // values are unchanged under the header's assumptions), as ggml does with `stride &= ~7`.
    const uint K = P_K & ~7u;
    const uint N = P_N & ~7u;

    // A: M x K, row stride K. B: N x K, row stride K (loaded through the transpose view).
    // C: M x N, row stride N.
    tensorLayoutNV<2> layoutA = createTensorLayoutNV(2);
    tensorLayoutNV<2> layoutB = createTensorLayoutNV(2);
    tensorLayoutNV<2> layoutC = createTensorLayoutNV(2);
    layoutA = setTensorLayoutDimensionNV(layoutA, P_M, K);
    layoutB = setTensorLayoutDimensionNV(layoutB, P_N, K);
    layoutC = setTensorLayoutDimensionNV(layoutC, P_M, N);
    layoutA = setTensorLayoutStrideNV(layoutA, K, 1);
    layoutB = setTensorLayoutStrideNV(layoutB, K, 1);
    layoutC = setTensorLayoutStrideNV(layoutC, N, 1);
    // Matrix element (row k, col n) of the BK x BN matrix maps to span coordinate (n, k) of a
    // BN x BK slice of B: B_mat[k][n] = b[(n0 + n) * K + k0 + k].
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    const uint m0 = ir * BM, n0 = ic * BN;
    MAT_C acc = MAT_C(0.0);

    uint k0 = 0;
    const uint k_unrolled = (K / (BK * UNROLL)) * (BK * UNROLL);
    for (; k0 < k_unrolled; k0 += BK * UNROLL) {
        [[unroll]] for (uint j = 0; j < UNROLL; ++j) {
            MAT_A ma;
            MAT_B mb;
            coopMatLoadTensorNV(ma, a, 0, sliceTensorLayoutNV(layoutA, m0, BM, k0 + j * BK, BK));
            coopMatLoadTensorNV(mb, b, 0, sliceTensorLayoutNV(layoutB, n0, BN, k0 + j * BK, BK), transposed);
            acc = coopMatMulAdd(ma, mb, acc);
        }
    }
    [[dont_unroll]] for (; k0 < K; k0 += BK) {
        MAT_A ma;
        MAT_B mb;
        coopMatLoadTensorNV(ma, a, 0, sliceTensorLayoutNV(layoutA, m0, BM, k0, BK));
        coopMatLoadTensorNV(mb, b, 0, sliceTensorLayoutNV(layoutB, n0, BN, k0, BK), transposed);
        acc = coopMatMulAdd(ma, mb, acc);
    }

    coopMatStoreTensorNV(acc, c, 0, sliceTensorLayoutNV(layoutC, m0, BM, n0, BN));
}
