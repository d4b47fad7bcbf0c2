#version 450
// Experiment: read into L2 what workgroups [first, first + gridsize) of matmul_coop_direct.comp
// (m_groups = 1) will read of its fp16 weight tiles.
#extension GL_EXT_control_flow_attributes : require
#define WG 128
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer Wb { uvec4 w4[]; };
layout(std430, binding = 4) readonly buffer W2b { uvec4 u4[]; };
layout(std430, binding = 2) writeonly buffer Ob { uint sink[]; };
layout(push_constant) uniform Push { uint N; uint K; uint kchunk; uint gated; } pc;
void main() {
    uint id = gl_WorkGroupID.x;
    uint n_groups = pc.N / 128u;
    uint ng = id % n_groups, c = id / n_groups;
    uint KB = pc.K / 16u, n0 = ng * 128u;
    bool up = pc.gated != 0u && n0 >= pc.N / 2u;
    uint row0 = (up ? n0 - pc.N / 2u : n0) / 16u;
    uint nkb = pc.kchunk / 16u, per_row = nkb * 32u, total = 8u * per_row;
    uvec4 acc = uvec4(0);
    for (uint e0 = gl_LocalInvocationID.x; e0 < total; e0 += 8u * WG) {
        uvec4 v[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            uint e = min(e0 + i * WG, total - 1u);
            uint at = ((row0 + e / per_row) * KB + c * nkb) * 32u + e % per_row;
            v[i] = up ? u4[at] : w4[at];
        }
        [[unroll]] for (uint i = 0u; i < 8u; i++) acc ^= v[i];
    }
    uint s = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (s == 0x9e3779b9u) sink[gl_LocalInvocationID.x] = s;
}
