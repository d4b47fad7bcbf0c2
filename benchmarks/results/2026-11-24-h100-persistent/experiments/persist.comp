#version 450
// Experiment: the read floor of a decode step with dependent phases, one dispatch per phase
// (barriers between, pc.iterations == 1) against one persistent dispatch running many phases
// with grid-wide barriers (atomic arrivals, polled), optionally loading the next read phase's
// first PF words before waiting (weights do not depend on the previous phase).
// Phase (kind | buffer << 8, offset, count, groups): kind 0 READ count uvec4 words from offset
// with a grid stride (every workgroup); kind 1 SMALL: workgroups < groups run a chain of `count`
// dependent loads of scratch, then store (a reduce's or attention's latency-bound work).
#extension GL_EXT_control_flow_attributes : require
#define WG 256
#ifndef PF
#define PF 0
#endif
#ifdef STASH  // the prefetched words in shared memory (each thread its own slots), not registers
shared uvec4 stash[PF * WG];
#define SLOT(j) stash[(j) * WG + lid]
#else
#define SLOT(j) pf[j]
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer Db { uvec4 data[]; };
layout(std430, binding = 5) readonly buffer Lb { uvec4 head[]; };
layout(std430, binding = 1) volatile coherent buffer Sb { uint sync[]; };
layout(std430, binding = 2) readonly buffer Pb { uvec4 phases[]; };
layout(std430, binding = 3) coherent buffer Xb { uvec4 scratch[]; };
layout(std430, binding = 4) writeonly buffer Ob { uint sink[]; };
layout(push_constant) uniform Push { uint n; uint iterations; } pc;  // first phase, phases
#define SPIN_LIMIT (1u << 16)
#define SCRATCH_MASK 65535u

uvec4 word(uint buf, uint i) { return buf == 0u ? data[i] : head[i]; }

void main() {
    uint groups = gl_NumWorkGroups.x, wg = gl_WorkGroupID.x, lid = gl_LocalInvocationIndex;
    uint stride = groups * WG, gid = gl_GlobalInvocationID.x;
    uvec4 acc = uvec4(0);
    uvec4 pf[PF + 1];
    uint have = 0u;  // prefetched words for the current phase
    for (uint k = 0u; k < pc.iterations; k++) {
        uvec4 ph = phases[pc.n + k];
        uint kind = ph.x & 255u, buf = ph.x >> 8;
        if (kind == 0u) {
            uint i = gid;
            [[unroll]] for (uint j = 0u; j < PF; j++) if (j < have) { acc ^= SLOT(j); i += stride; }
            for (; i < ph.z; i += stride) acc ^= word(buf, ph.y + i);
        } else if (wg < ph.w) {
            uint idx = (wg * WG + lid) & SCRATCH_MASK;
            uvec4 v = scratch[idx];
            for (uint r = 0u; r < ph.z; r++) {
                v = scratch[(v.x + idx + r) & SCRATCH_MASK];
                barrier();
            }
            scratch[idx] = v + 1u;
        }
        have = 0u;
        if (k + 1u == pc.iterations) break;
        memoryBarrierBuffer();
        barrier();
        uint base = 2u + 2u * pc.n;  // this dispatch's arrival count
        if (lid == 0u) atomicAdd(sync[base], 1u);  // arrive, then prefetch while the others finish
        uvec4 nx = phases[pc.n + k + 1u];
        if (PF > 0 && (nx.x & 255u) == 0u) {  // the next read's first words, before the wait
            uint nb = nx.x >> 8;
            [[unroll]] for (uint j = 0u; j < PF; j++) {
                uint i = gid + j * stride;
                if (i < nx.z) { SLOT(j) = word(nb, nx.y + i); have = j + 1u; }
            }
#ifdef FORCE  // the loads complete before this workgroup waits (no compiler may sink them past it)
            uint sig = 0u;
            [[unroll]] for (uint j = 0u; j < PF; j++) if (j < have) sig ^= SLOT(j).y;
            if (sig == 0x7f4a7c15u) sink[gid] = sig;
            memoryBarrierBuffer();
#endif
        }
        if (lid == 0u) {
            uint target = (k + 1u) * groups;
            for (uint polls = 0u; sync[base] < target; polls++) {
                if (polls == SPIN_LIMIT) { atomicAdd(sync[1], 1u); break; }
            }
        }
        barrier();
        memoryBarrierBuffer();
    }
    uint v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (v == 0x9e3779b9u) sink[gid] = v;
}
