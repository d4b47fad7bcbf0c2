#version 450
// Experiment: read_bandwidth.comp's reads in two patterns. Default: grid stride (the whole grid
// sweeps the buffer). BLOCK: workgroup w reads words [w n / G, (w + 1) n / G) with a stride of
// its size (each workgroup streams its own region, as the decode matmul does).
#ifndef WG
#define WG 256
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer Db { uvec4 data[]; };
layout(std430, binding = 1) writeonly buffer Ob { uint sink[]; };
layout(push_constant) uniform Push { uint n; uint iterations; } pc;

void main() {
    uvec4 acc = uvec4(0);
#ifdef BLOCK
    uint G = gl_NumWorkGroups.x, w = gl_WorkGroupID.x;
    uint per = (pc.n + G - 1u) / G;
    uint lo = w * per, hi = min(pc.n, lo + per);
    for (uint it = 0; it < pc.iterations; it++)
        for (uint i = lo + gl_LocalInvocationIndex; i < hi; i += WG) acc ^= data[i];
#else
    uint stride = gl_NumWorkGroups.x * WG;
    for (uint it = 0; it < pc.iterations; it++)
        for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) acc ^= data[i];
#endif
    uint v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (v == 0x9e3779b9u) sink[gl_GlobalInvocationID.x] = v;
}
