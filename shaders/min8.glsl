// min8 weights (W_Q4 | W_Q5; model/quant.py): the codes' low 4 bits as int4's (8 a word, lowest
// nibble first), then in the scales part a side row per weight row of Q_SIDE_WORDS words: the
// row's two fp16 steps (ds, dm), W_Q5's fifth bits (a byte per piece of 8, bit j for code j),
// then per group (pc.group weights) a byte pair: the scale's multiple of ds (0..255) and the minimum's of
// dm (int8), padded to a word. A group's scale s8 * ds and minimum m8 * dm are exact in fp32.
#if defined(W_Q5)
#define Q_HIGH_WORDS(K) ((K) / 32u)
#else
#define Q_HIGH_WORDS(K) 0u
#endif
#define Q_SIDE_WORDS(K, G) ((4u + 4u * Q_HIGH_WORDS(K) + 2u * ((K) / (G)) + 3u) / 4u)  // G: pc.group
#define Q_PAIR_WORD(K, g) (1u + Q_HIGH_WORDS(K) + (g) / 2u)  // the word of group g's pair in a side row

// Group g's (scale, minimum) from its side row's steps (ds, dm) and the word holding its pair.
vec2 min8_pair(vec2 d, uint word, uint g) {
    uint sh = 16u * (g & 1u);
    return vec2(float((word >> sh) & 255u) * d.x, float(bitfieldExtract(int(word), int(sh) + 8, 8)) * d.y);
}

// The fifth bits of 4 codes (bits 0..3 of h) as 16 or 0.
vec4 high4(uint h) { return vec4(h & 1u, (h >> 1) & 1u, (h >> 2) & 1u, (h >> 3) & 1u) * 16.0; }

// A word's 8 codes (8 nibbles, lowest first) with their fifth bits (bit j of h for code j; 0 for
// int4) as floats: codes 0, 2, 4, 6 in `even`, 1, 3, 5, 7 in `odd`. Each code goes into a byte
// of its own first (the fifth bits spread to bit 4 of each byte by one multiply: (h & 0x55) *
// 0x410410 puts bits 0, 2, 4, 6 at 4, 12, 20, 28 with no carry into those), so a byte's
// conversion is the only work left per code.
void codes8(uint v, uint h, out vec4 even, out vec4 odd) {
    uint e = (v & 0x0F0F0F0Fu) | (((h & 0x55u) * 0x410410u) & 0x10101010u);
    uint o = ((v >> 4) & 0x0F0F0F0Fu) | ((((h >> 1) & 0x55u) * 0x410410u) & 0x10101010u);
    even = vec4(e & 255u, (e >> 8) & 255u, (e >> 16) & 255u, e >> 24);
    odd = vec4(o & 255u, (o >> 8) & 255u, (o >> 16) & 255u, o >> 24);
}
