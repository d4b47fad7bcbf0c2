#version 450
// x[t, :] = E[token_ids[t], :] * scale   (Gemma's sqrt(H) embedding scale, as an fp32 product)
// Variants: W_BF16 | W_F16 | W_F32 | W_I8 | W_T16 | W_T8, the table's storage type (W_I8: int8 codes
// [V, H], then an fp16 scale per 32 of a row's values, as matmul.comp reads them; W_T16: fp16 in 16 x 16 tiles, as
// matmul_coop_direct.comp reads them, where the table is also the LM head; W_T8: int8 codes in
// fragment-order tiles and their scales, as matmul_coop_direct.comp reads them, there too). One workgroup per token.
// A token id -1 - r (< 0) is the id the step before sampled into its row r (binding 3: the other
// input set's ids, step_buffers.py), for a step submitted while that one ran; where that id is
// negative (NON_FINITE: the engine stops at that step and drops this one) row 0 is read instead.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(constant_id = 6) const bool FRAGMENT_LOADS = false;  // W_T16 tiles in fragment order (coop_fragment.glsl)

layout(std430, binding = 0) readonly buffer Eb { uint e[]; };
layout(std430, binding = 1) readonly buffer Tb { int token_ids[]; };
layout(std430, binding = 2) writeonly buffer Xb { float x[]; };
layout(std430, binding = 3) readonly buffer Pb { int prev_ids[]; };

layout(push_constant) uniform Push {
    uint H;
    float scale;
    uint V;  // rows of the table (W_I8: its scales follow the V H codes)
} pc;

float table(uint row, uint h) {
#if defined(W_T16) || defined(W_T8)  // tile (row / 16, h / 16) of 256 values, its row row % 16, or in fragment order
    uint r = row % 16, c = h % 16;  // (lane, component) of (r, c): fragment_order.py
#ifdef W_T8
    bool fragments = true;
#else
    bool fragments = FRAGMENT_LOADS;
#endif
    uint at = fragments ? ((r % 8u) * 4u + (c % 8u) / 2u) * 8u + c % 2u + 2u * (c / 8u) + 4u * (r / 8u) : r * 16u + c;
    uint i = ((row / 16) * (pc.H / 16) + h / 16) * 256 + at;
#else
    uint i = row * pc.H + h;
#endif
#if defined(W_T8)  // word (strip, r % 8, group of 32) holds rows r % 8 and r % 8 + 8
    uint word_at = pc.V * (pc.H / 4) + ((row / 16) * 8 + r % 8u) * (pc.H / 32) + h / 32;
    return float(bitfieldExtract(int(e[i / 4]), int(8u * (i & 3u)), 8)) * half_of(e[word_at], r / 8u);
#elif defined(W_I8)
    int word = int(e[i / 4]);
    uint at = i / INT8_GROUP;  // (row, group of 32) in row order, as i / 32 for rows of whole groups
    return float(bitfieldExtract(word, int(8u * (i & 3u)), 8)) * half_of(e[pc.V * (pc.H / 4) + at / 2], at & 1u);
#elif defined(W_F32)
    return uintBitsToFloat(e[i]);
#elif defined(W_F16) || defined(W_T16)
    vec2 pair = unpackHalf2x16(e[i / 2]);
    return (i & 1u) == 0u ? pair.x : pair.y;
#else
    uint w = e[i / 2];
    return (i & 1u) == 0u ? bf16_lo(w) : bf16_hi(w);
#endif
}

void main() {
    uint t = linear_group();
    if (t >= meta.num_tokens) return;
    int token = token_ids[t];
    uint row = uint(max(token < 0 ? prev_ids[-1 - token] : token, 0));
    for (uint h = gl_LocalInvocationID.x; h < pc.H; h += 256) x[t * pc.H + h] = table(row, h) * pc.scale;
}
