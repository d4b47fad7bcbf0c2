#version 450
// C [M, N] fp32 = A [M, K] fp16 . B [N, K]^T fp16 with workgroup-scope matrices
// (VK_NV_cooperative_matrix2). glslang 13.1.1 knows no GL_NV_cooperative_matrix2, so this source
// is written with subgroup-scope 16 x 16 matrices and cm2_build.py rewrites the SPIR-V: the
// matrix types get scope Workgroup and BM x BK, BK x BN, BM x BN (the device needs the features
// cooperativeMatrixWorkgroupScope and -FlexibleDimensions). A workgroup owns one BM x BN tile of C; the driver stages
// the loads. M, N multiples of the tile, K of BK.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#ifdef HINT
#define ALIGN(v) ((v) & ~7u)
#else
#define ALIGN(v) (v)
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer Ab { float16_t a[]; };
layout(std430, binding = 1) readonly buffer Bb { float16_t b[]; };
layout(std430, binding = 2) writeonly buffer Cb { float c[]; };
layout(push_constant) uniform Push { uint M; uint N; uint K; uint pad; } pc;

void main() {
    uint groups_n = pc.N / BN;
    uint m0 = (gl_WorkGroupID.x / groups_n) * BM, n0 = (gl_WorkGroupID.x % groups_n) * BN;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    uint K = ALIGN(pc.K);  // ALIGN(v) = v & ~7 tells the compiler the loads are 16-byte aligned
    for (uint k0 = 0; k0 < K; k0 += BK) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> ma;
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> mb;
        coopMatLoad(ma, a, ALIGN(m0 * K + k0), K, gl_CooperativeMatrixLayoutRowMajor);
        coopMatLoad(mb, b, ALIGN(n0 * K + k0), K, gl_CooperativeMatrixLayoutColumnMajor);
        acc = coopMatMulAdd(ma, mb, acc);
    }
    coopMatStore(acc, c, ALIGN(m0 * pc.N + n0), ALIGN(pc.N), gl_CooperativeMatrixLayoutRowMajor);
}
