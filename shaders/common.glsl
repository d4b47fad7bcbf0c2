// Shared by every gemma-batch shader: the step header, weight loads, deterministic reductions.
//
// All 16-bit data (bf16/fp16 weights, fp16 KV pages) is read and written as 32-bit words, so
// the shaders need neither shaderFloat16 nor shaderInt16: bf16 -> fp32 is a 16-bit shift (exact),
// fp16 -> fp32 is unpackHalf2x16 (exact).

// The step header, written by the host before each submit (binding 7 in every kernel).
layout(std430, set = 0, binding = 7) readonly buffer Meta {
    uint num_tokens;   // T: tokens in the flattened batch
    uint num_seqs;     // S
    uint num_rows;     // R: rows of logits computed (sampled tokens, or all T)
    uint vocab_limit;  // ids >= this are never sampled
    uint prompt_start; // the first prompt token (T: none); they come last (StepBatch), partial_rows.glsl
} meta;

// A matmul's K-chunk partial sums loaded at a time where a kernel adds them (reduce.comp,
// attention_heads.glsl); the sums run chunk 0, 1, ... in order whatever it is.
#define SUM_LOADS 8

// The last to finish runs what follows (a merge, an epilogue, a split): each workgroup makes its
// writes visible and counts itself done on `counter` (a uint in a coherent buffer: zero at the
// start of the step, reset by the last); all but the `count`-th to count return from the calling
// function, and the last goes on and sees every workgroup's writes. `flag`: a shared bool of the
// kernel. Which workgroup is last never changes a result: the last reads every record in a fixed
// order. Call from uniform control flow.
#define RETURN_UNLESS_LAST(flag, counter, count) \
    memoryBarrierBuffer(); \
    barrier(); \
    if (gl_LocalInvocationIndex == 0u) flag = atomicAdd(counter, 1u) == (count) - 1u; \
    barrier(); \
    if (!flag) return; \
    memoryBarrierBuffer()

// Linear workgroup id over an (x, y) grid; the host spreads large counts over y (limits of 65535).
uint linear_group() { return gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y; }

float bf16_lo(uint w) { return uintBitsToFloat(w << 16); }
float bf16_hi(uint w) { return uintBitsToFloat(w & 0xffff0000u); }

// Quantized weights (model/quant.py): 4 int8 codes of a word, as floats (exact); 4 int4 codes of
// the low 16 bits (0..15, lowest nibble first); half `which` of a word of two fp16 values.
#define INT8_GROUP 32  // int8 weights per scale (quant.INT8_GROUP)
vec4 int8x4(uint w) {
    int v = int(w);
    return vec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8), bitfieldExtract(v, 16, 8), bitfieldExtract(v, 24, 8));
}
vec4 uint4x4(uint w) { return vec4(w & 15u, (w >> 4) & 15u, (w >> 8) & 15u, (w >> 12) & 15u); }
float half_of(uint pair, uint which) {
    vec2 s = unpackHalf2x16(pair);
    return which == 0u ? s.x : s.y;
}
// Dequantized weights as fp16 for the matrix units: two (a word), or 8 (lo then hi), clamped into fp16's range.
uint fp16_pair(float a, float b) { return packHalf2x16(clamp(vec2(a, b), vec2(-65504.0), vec2(65504.0))); }
uvec4 fp16_8(vec4 lo, vec4 hi) {
    return uvec4(fp16_pair(lo.x, lo.y), fp16_pair(lo.z, lo.w), fp16_pair(hi.x, hi.y), fp16_pair(hi.z, hi.w));
}
// 8 int8 codes (two words) as fp16: the first word's times s.x, the second's times s.y.
uvec4 int8_fp16_8(uvec2 v, vec2 s) { return fp16_8(int8x4(v.x) * s.x, int8x4(v.y) * s.y); }

// tanh without overflow: exp of a non-positive argument only.
float safe_tanh(float x) {
    float t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

// GELU, tanh approximation (torch gelu(approximate="tanh")).
float gelu_tanh(float x) {
    return 0.5 * x * (1.0 + safe_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// sin and cos of an fp32 angle of any size up to ~1e6 rad, accurate to about 1e-7 absolute:
// Cody-Waite reduction by pi/2 in three fma steps, then minimax polynomials on [-pi/4, pi/4].
// Driver sin/cos are only required to be good to 2^-11 on [-pi, pi], too coarse for RoPE.
vec2 sincos_reduced(float a) {
    precise float k = round(a * 0.63661977236758134);
    precise float r = fma(-k, 1.5707963705062866, a);       // pi/2 rounded to fp32
    r = fma(-k, -4.3711388286737929e-08, r);                 // pi/2 - that
    r = fma(-k, -1.7151245100059164e-15, r);                 // the rest
    precise float r2 = r * r;  // (precise: the same bits in every kernel, qk_rope.glsl)
    precise float s = r + r * r2 * (-1.6666654611e-1 + r2 * (8.3321608736e-3 + r2 * -1.9515295891e-4));
    precise float c = 1.0 + r2 * (-0.5 + r2 * (4.166664568298827e-2 + r2 * (-1.388731625493765e-3 + r2 * 2.443315711809948e-5)));
    int q = int(k) & 3;
    if (q == 0) return vec2(s, c);
    if (q == 1) return vec2(c, -s);
    if (q == 2) return vec2(-s, -c);
    return vec2(-c, s);
}

// 1 / x and 1 / sqrt(x) for normal x > 0 from operations Vulkan rounds correctly (multiply,
// add): an integer seed, then Newton steps (4: the seeds are within 12% and 3.5%), so that two
// kernels get the same bits for the same x (qk_rope.glsl); OpFDiv and sqrt may differ by ulps.
// Within a few ulp of the true values.
float rcp_det(float x) {
    precise float r = uintBitsToFloat(0x7ef311c3u - floatBitsToUint(x));
    for (uint i = 0u; i < 4u; i++) r = r * (2.0 - x * r);
    return r;
}
float rsqrt_det(float x) {
    precise float y = uintBitsToFloat(0x5f3759dfu - (floatBitsToUint(x) >> 1));
    precise float h = 0.5 * x;
    for (uint i = 0u; i < 4u; i++) y = y * (1.5 - h * y * y);
    return y;
}

// exp(d) for d <= 0 within 1.02e-7 relative on any driver (Vulkan's exp may be off by 3 + 2|d|
// ulp): Cody-Waite reduction by ln 2 (k * 0.693359375 is exact for |k| <= 126), a degree-7
// polynomial on |r| <= 0.35. Exactly 1 at d = 0; 0 below -87. (sample.comp's weights, row_scores.comp.)
float exp_neg(float d) {
    if (!(d >= -87.0)) return 0.0;
    precise float k = round(d * 1.44269504088896341);
    precise float r = d - k * 0.693359375;
    r = r + k * 2.12194440e-4;
    precise float p = 1.0 + r * (1.0 + r * (0.5 + r * (1.6666667163e-1 + r * (4.1666667908e-2
                    + r * (8.3333337680e-3 + r * (1.3888889225e-3 + r * 1.9841270114e-4))))));
    return ldexp(p, int(k));
}
