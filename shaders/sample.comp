#version 450
// One token per row of logits [R, row_stride] (fp32): the rule of gemma_batch/backends/sampler.py.
// Greedy rows take the arg-max below meta.vocab_limit (lowest id on ties).
// (Temperature / top-k / top-p / min-p: to come; rows with temperature > 0 are greedy for now.)
#include "common.glsl"
#define WG 256
layout(local_size_x = WG) in;

struct RowParams {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint key0;
    uint key1;
    uint counter;
    uint pad;
};

layout(std430, binding = 0) readonly buffer Lb { float logits[]; };
layout(std430, binding = 1) readonly buffer Pb { RowParams params[]; };
layout(std430, binding = 2) writeonly buffer Ob { int ids[]; };

layout(push_constant) uniform Push {
    uint row_stride;
} pc;

shared float best_v[WG];
shared uint best_i[WG];

void main() {
    uint r = linear_group();
    if (r >= meta.num_rows) return;
    uint tid = gl_LocalInvocationID.x;
    uint base = r * pc.row_stride;
    float bv = -1.0 / 0.0;
    uint bi = 0xffffffffu;
    for (uint i = tid; i < meta.vocab_limit; i += WG) {
        float v = logits[base + i];
        if (v > bv) { bv = v; bi = i; }  // ids rise along the loop: the first maximum is kept
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint half_ = WG / 2; half_ > 0; half_ >>= 1) {
        if (tid < half_) {
            float v = best_v[tid + half_];
            uint i = best_i[tid + half_];
            if (v > best_v[tid] || (v == best_v[tid] && i < best_i[tid])) { best_v[tid] = v; best_i[tid] = i; }
        }
        barrier();
    }
    if (tid == 0) ids[r] = int(best_i[0]);
}
