#version 450
// A bf16 or fp16 matrix's rows [R, K] as fp16 16 x 16 tiles (backends/vulkan/weights.py, on the
// device at load: the host's fp16_tiles did the same at about 0.6 GB/s): tile (r / 16, k / 16) is
// the 256 halves at ((r / 16) * K / 16 + k / 16) * 256 of the output, row-major within the tile,
// or with pc.fragment in fragment order (fragment_order.py's ORDER: position 8 l + i holds row
// g + 8 (i / 4), column 2 t + i % 2 + 8 ((i / 2) % 2) of lane l = 4 g + t).
//
// bf16 to fp16 is weights.fp16_bits', bit for bit: a value in fp16's normal range by rebasing its
// exponent (exact), a smaller one to fp16's subnormals rounded to nearest even, a larger one
// clamped to +-65504; a NaN or infinity is counted in bad[0] (the host refuses the tensor) and
// written as +-65504.
//
// One invocation writes one output word (two halves, neighbours in a source row in both orders).
// No step header: dispatched directly, at least pc.words invocations.
#define WG 256
layout(local_size_x = WG) in;

layout(std430, binding = 0) readonly buffer Sb { uint src[]; };   // [R, K] 16-bit values, two a word
layout(std430, binding = 1) writeonly buffer Db { uint dst[]; };  // the weight buffer
layout(std430, binding = 2) buffer Bb { uint bad[]; };            // [0]: non-finite values seen

layout(push_constant) uniform Push {
    uint words;     // output words: R * K / 2
    uint K;
    uint dst_word;  // where the R rows' tiles start in dst (words)
    uint fragment;  // 1: fragment order, 0: row-major tiles
    uint bf16;      // 1: src is bf16 (converted), 0: fp16 (copied)
} pc;

// Round x / 2^s to the nearest integer, ties to even (s >= 1).
uint shift_rne(uint x, uint s) {
    if (s >= 31u) return 0u;
    uint q = x >> s, rest = x & ((1u << s) - 1u), half_ = 1u << (s - 1u);
    return q + uint(rest > half_ || (rest == half_ && (q & 1u) == 1u));
}

uint fp16_of_bf16(uint b) {
    uint sign = b & 0x8000u, magnitude = b & 0x7FFFu;
    if (magnitude >= 0x3880u && magnitude < 0x4780u) return sign | ((magnitude - 0x3800u) << 3);  // exponents 113..142
    if (magnitude >= 0x7F80u) {  // inf or nan
        atomicAdd(bad[0], 1u);
        return sign | 0x7BFFu;
    }
    if (magnitude >= 0x4780u) return sign | 0x7BFFu;  // beyond 65504: clamped
    uint e = magnitude >> 7;
    if (e == 0u) return sign;  // bf16 subnormals and zero: below fp16's smallest subnormal half
    // (128 + m) * 2^(e - 134) in units of fp16's 2^-24: (128 + m) * 2^(e - 110), e <= 112
    uint x = 128u + (magnitude & 0x7Fu);
    return sign | (e >= 110u ? x << (e - 110u) : shift_rne(x, 110u - e));
}

void main() {
    uint w = gl_GlobalInvocationID.x;
    if (w >= pc.words) return;
    uint e = 2u * w, tile = e / 256u, p = e % 256u, kt = pc.K / 16u;
    uint r, c;
    if (pc.fragment == 1u) {
        uint lane = p / 8u, i = p % 8u;
        r = lane / 4u + 8u * (i / 4u);
        c = 2u * (lane % 4u) + 8u * ((i / 2u) % 2u);
    } else {
        r = p / 16u;
        c = p % 16u;
    }
    uint pair = src[((tile / kt) * 16u + r) * (pc.K / 2u) + ((tile % kt) * 16u + c) / 2u];
    if (pc.bf16 == 1u) pair = fp16_of_bf16(pair & 0xFFFFu) | (fp16_of_bf16(pair >> 16) << 16);
    dst[pc.dst_word + w] = pair;
}
