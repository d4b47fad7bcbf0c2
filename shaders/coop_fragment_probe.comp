#version 450
// The component order of a 16 x 16 fp16 A fragment (VK_KHR_cooperative_matrix leaves it to the
// driver): one subgroup loads a row-major tile whose element (r, c) holds r * 16 + c, and writes
// out[0] = the components per lane, then out[1 + 8 l + i] = lane l's component i (where there
// are 8). fragment_order.py compares it with the order the weight tiles are stored in.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
layout(local_size_x = 32) in;

layout(std430, binding = 0) readonly buffer Tb { uvec4 tile[]; };  // 256 fp16, row-major
layout(std430, binding = 1) writeonly buffer Ob { uint o[]; };
layout(push_constant) uniform Push {
    uint words;  // of o: 1 + 256
} pc;

void main() {
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    coopMatLoad(a, tile, 0, 2, gl_CooperativeMatrixLayoutRowMajor);
    uint lane = gl_SubgroupInvocationID, n = uint(a.length());
    if (lane == 0u) o[0] = n;
    if (n * gl_SubgroupSize + 1u > pc.words) return;
    for (uint i = 0u; i < n; i++) o[1u + lane * n + i] = uint(float(a[i]));
}
