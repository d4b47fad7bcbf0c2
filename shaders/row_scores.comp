#version 450
// Log-probabilities of given tokens from rows of logits [R, row_stride] (fp32), without reading the
// rows back: score row i (a workgroup) names its logits row r and its pairs [first, first + n), and
// scores[p] = x[r, id_p] - (m + log(sum over ids below meta.vocab_limit of exp(x - m))), m the row's
// max: the log-softmax of the row (no temperature, no mask), at the pairs' ids (engine/choices.py
// scores a row's choices with it; the CPU backend computes the same in float64).
//
// Every invocation reduces its ids (id = invocation + k WG, k ascending) in order, then the
// workgroup halves in a fixed tree: the same sums, bit for bit, whatever else the step holds.
// exp_neg (common.glsl) is within 1.02e-7 relative; the fp32 sums of a 262,144-id row are within
// about 1e-6 relative of exact, so a score is within about 1e-6 of the float64 log-softmax of the
// same logits.
#include "common.glsl"

#define WG 1024

layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Lb { float logits[]; };
layout(std430, binding = 1) readonly buffer Rb { uint score_rows[]; };  // [0]: score rows; then (logits row, first pair, pairs) each
layout(std430, binding = 2) readonly buffer Ib { uint pair_ids[]; };
layout(std430, binding = 3) writeonly buffer Ob { float scores[]; };

layout(push_constant) uniform Push {
    uint row_stride;
} pc;

shared float red[WG];

void main() {
    uint i = linear_group();
    if (i >= score_rows[0]) return;
    uint tid = gl_LocalInvocationID.x;
    uint base = score_rows[1u + 3u * i] * pc.row_stride, first = score_rows[2u + 3u * i], n = score_rows[3u + 3u * i];
    uint L = min(meta.vocab_limit, pc.row_stride);
    float m = -1.0 / 0.0;
    for (uint j = tid; j < L; j += WG) m = max(m, logits[base + j]);
    red[tid] = m;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] = max(red[tid], red[tid + h]);
        barrier();
    }
    m = red[0];
    barrier();
    float s = 0.0;
    for (uint j = tid; j < L; j += WG) s += exp_neg(logits[base + j] - m);
    red[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    precise float lse = m + log(red[0]);
    for (uint p = tid; p < n; p += WG) scores[first + p] = logits[base + pair_ids[first + p]] - lse;
}
