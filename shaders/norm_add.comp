#version 450
// x[t, :] += rms_norm(y[t, :]) * (1 + w): Gemma's post-attention / post-feedforward norm and the
// residual add, in one pass. One workgroup per token; the sum of squares is a fixed-order tree.
#include "common.glsl"
#define WG 256
layout(local_size_x = WG) in;

layout(std430, binding = 0) buffer Xb { float x[]; };
layout(std430, binding = 1) readonly buffer Yb { float y[]; };
layout(std430, binding = 3) readonly buffer Gb { float g[]; };

layout(push_constant) uniform Push {
    uint H;
    float eps;
} pc;

shared float red[WG];

void main() {
    uint t = linear_group();
    if (t >= meta.num_tokens) return;
    uint tid = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint h = tid; h < pc.H; h += WG) s += y[t * pc.H + h] * y[t * pc.H + h];
    red[tid] = s;
    barrier();
    for (uint half_ = WG / 2; half_ > 0; half_ >>= 1) {
        if (tid < half_) red[tid] += red[tid + half_];
        barrier();
    }
    float denom = sqrt(red[0] / float(pc.H) + pc.eps);
    for (uint h = tid; h < pc.H; h += WG) x[t * pc.H + h] += y[t * pc.H + h] / denom * (1.0 + g[h]);
}
