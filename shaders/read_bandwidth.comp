#version 450
// The device's streaming-read bandwidth (`gemma-batch bench`): every invocation reads 16-byte
// words of `data` with a grid-wide stride, `iterations` times over the buffer, and writes one
// xor so the reads cannot be optimised away. No step header: dispatched directly.
#define WG 256
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Db { uvec4 data[]; };
layout(std430, binding = 1) writeonly buffer Ob { uint sink[]; };

layout(push_constant) uniform Push {
    uint n;           // uvec4 words in data
    uint iterations;  // passes over the buffer
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * WG;
    uvec4 acc = uvec4(0);
    for (uint it = 0; it < pc.iterations; it++) {
        for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) acc ^= data[i];
    }
    uint v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (v == 0x9e3779b9u) sink[gl_GlobalInvocationID.x] = v;  // almost never: no write traffic
}
