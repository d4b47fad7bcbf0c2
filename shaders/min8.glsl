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
