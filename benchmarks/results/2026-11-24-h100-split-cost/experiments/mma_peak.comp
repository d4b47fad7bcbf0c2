#version 450
// The matrix units' peak through VK_KHR_cooperative_matrix: each subgroup multiplies fragments held
// in registers, TN x TM independent 16 x 16 x 16 fp16 -> fp32 products per iteration, no memory
// traffic in the loop. FLOPs = workgroups * 4 subgroups * iterations * TN * TM * 8192.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#ifndef TN
#define TN 2
#endif
#ifndef TM
#define TM 4
#endif
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Ab { uvec4 a4[]; };
layout(std430, binding = 1) readonly buffer Bb { uvec4 b4[]; };
layout(std430, binding = 2) writeonly buffer Cb { float c[]; };
layout(push_constant) uniform Push { uint M; uint N; uint K; uint pad; } pc;  // K: iterations
#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
void main() {
    MAT_A a[TN]; MAT_B b[TM]; ACC acc[TN * TM];
    [[unroll]] for (uint i = 0; i < TN; i++) coopMatLoad(a[i], a4, i * 32, 2, gl_CooperativeMatrixLayoutRowMajor);
    [[unroll]] for (uint i = 0; i < TM; i++) coopMatLoad(b[i], b4, i * 32, 2, gl_CooperativeMatrixLayoutColumnMajor);
    [[unroll]] for (uint i = 0; i < TN * TM; i++) acc[i] = ACC(0.0);
    for (uint it = 0; it < pc.K; it++) {
        [[unroll]] for (uint tn = 0; tn < TN; tn++)
            [[unroll]] for (uint tm = 0; tm < TM; tm++) acc[tn * TM + tm] = coopMatMulAdd(a[tn], b[tm], acc[tn * TM + tm]);
    }
    uint base = (gl_WorkGroupID.x * 4 + gl_SubgroupID) * TN * TM * 256;
    [[unroll]] for (uint i = 0; i < TN * TM; i++) coopMatStore(acc[i], c, base + i * 256, 16, gl_CooperativeMatrixLayoutRowMajor);
}
