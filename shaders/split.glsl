// Writing a row as the input of a cooperative-matrix matmul (matmul_coop.comp): the values v of
// the row are scaled by s = 2^e, the power of two that puts max |v| in [2^14, 2^15) (fp16
// overflows at 65504), then hi = fp16(s v) and lo = fp16(s v - hi): hi + lo carries 22
// significant bits. Row m of the output is [hi (K) | lo (K)], fp16 pairs in 32-bit words (K
// words per row), and scale[m] = 1 / s (exact), which reduce.comp applies to the matmul's sums.
// Used by split.comp and by reduce.comp's variants that write the next matmul's input.

// v rounded to fp16's 11 significant bits (nearest, ties to even) in fp32 by integer arithmetic:
// exact in fp16 for the scaled values (|v| < 2^15). Not unpackHalf2x16(packHalf2x16(v)): NVIDIA's
// compiler (driver 580) folds that round trip to v, which left lo = 0.
vec2 fp16_round(vec2 v) {
    uvec2 u = floatBitsToUint(v);
    return uintBitsToFloat((u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u);
}

// s for a row whose largest |v| is mx.
float split_scale(float mx) {
    int e = 0;
    if (mx > 0.0) frexp(mx, e);  // mx < 2^e
    return exp2(float(clamp(15 - e, -100, 100)));
}

// The hi and lo words of two scaled values.
uvec2 split_words(vec2 scaled) {
    vec2 h = fp16_round(scaled);
    return uvec2(packHalf2x16(h), packHalf2x16(scaled - h));
}
