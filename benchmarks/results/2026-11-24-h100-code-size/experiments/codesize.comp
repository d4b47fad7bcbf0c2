#version 450
// Experiment: does a kernel's binary size cost time per dependent dispatch (instruction fetch
// after the barrier)? The same dynamic work, ITERS rounds of 4 independent nonlinear chains
// after one load, either unrolled (UNROLL: straight-line code, a large binary) or in a loop of
// 8 rounds (a small binary). SEED makes binaries that differ, so a chain of dispatches can
// cycle through several, as a step does. read_bandwidth's push constants: n (uvec4 words of
// data), iterations (= ITERS / 8 for the loop build).
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Db { uvec4 data[]; };
layout(std430, binding = 1) writeonly buffer Ob { uint sink[]; };
layout(push_constant) uniform Push { uint n; uint iterations; } pc;

#define ROUND(i) \
    a = (a ^ (a >> 13)) * 0x5bd1e995u + (i); b = (b ^ (b >> 11)) * 0x27d4eb2du + (i); \
    c = (c ^ (c >> 15)) * 0x85ebca6bu + (i); d = (d ^ (d >> 12)) * 0xc2b2ae35u + (i);

void main() {
    uvec4 v = data[gl_GlobalInvocationID.x % pc.n];
    uint a = v.x + SEED, b = v.y, c = v.z, d = v.w;
#ifdef UNROLL
    [[unroll]] for (uint i = 0; i < ITERS; i++) { ROUND(i) }
#else
    for (uint r = 0; r < pc.iterations; r++) {
        [[unroll]] for (uint j = 0; j < 8; j++) { ROUND(r * 8u + j) }
    }
#endif
    uint x = a ^ b ^ c ^ d;
    if (x == 0x9e3779b9u) sink[gl_GlobalInvocationID.x] = x;  // almost never
}
