#version 450
// Dry-run stand-in for gemm_cm2.comp on devices without coopmat2 (Mesa llvmpipe): the same
// interface (bindings 0-2, push constants M, N, K, pad; SPEC_MNK as there), plain fp32 sums.
// A workgroup of 256 owns a 16 x 16 tile of C, one element each; tile index M fastest.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 256) in;
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
void main() {
    uint blocks_m = P_M / 16;
    uint ir = gl_WorkGroupID.x % blocks_m, ic = gl_WorkGroupID.x / blocks_m;
    uint m = ir * 16 + gl_LocalInvocationID.x / 16, n = ic * 16 + gl_LocalInvocationID.x % 16;
    float s = 0.0;
    for (uint k = 0; k < P_K; ++k) s += float(a[m * P_K + k]) * float(b[n * P_K + k]);
    c[m * P_N + n] = s;
}
