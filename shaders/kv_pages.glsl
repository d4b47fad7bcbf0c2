// The KV pages: where K and V sit (gemma_batch/backends/kv_formats.py defines the values).
//
// Each layer has one K and one V buffer of `slots` token slots (slot = block * block_size + offset);
// row r = slot * nkv + j holds kv head j of that slot's hd values (K after QK-norm and RoPE, V as
// projected). A row is, with the variant's define:
//   KV_F32   hd fp32                                                        4 hd bytes
//   KV_F16   hd fp16, two to a 32-bit word (the first in the low half)      2 hd bytes
//   KV_BF16  hd bf16, likewise                                              2 hd bytes
//   KV_I8    hd int8, four to a word (the first in the low byte), then      hd + 4 hd / g bytes
//            the fp32 scale s of each group of g = kv_i8_group(hd) values:
//            value d is q[d] * s[d / g]
// so a slot is kv_formats.kv_slot_bytes bytes and a buffer exactly slots times that. The int8
// rows are 4-byte aligned only (read as words). matmul_epilogue.glsl (EPI_QK_ROPE) writes the
// rows, attention.comp reads them.

// Values per int8 scale (kv_formats.kv_int8_group): 32, or the whole head where hd is no multiple of 32.
uint kv_i8_group(uint hd) { return hd % 32u == 0u ? 32u : hd; }
// 32-bit words per int8 row: the values, then the scales (from word hd / 4 of the row).
uint kv_i8_row_words(uint hd) { return hd / 4u + hd / kv_i8_group(hd); }

// Two floats as bf16, rounded to nearest even on the bits (kv_formats.bf16_round), in one word.
uint pack_bf16x2(vec2 v) {
    uvec2 b = floatBitsToUint(v);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return b.x | (b.y << 16);
}

// a - q b exactly, for q within an ulp of a / b (the remainder is then a float): Dekker's
// product with Veltkamp's split (q b = p + e), every step rounded once. No fma: Vulkan lets it
// round twice, and llvmpipe does.
float remainder_exact(float a, float q, float b) {
    precise float p = q * b;
    precise float cq = 4097.0 * q, qh = cq - (cq - q), ql = q - qh;
    precise float cb = 4097.0 * b, bh = cb - (cb - b), bl = b - bh;
    precise float e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;
    precise float r = (a - p) - e;  // a - p is exact (Sterbenz)
    return r;
}

// a / b rounded to nearest, as IEEE division (numpy's) gives it, for a = 0 or normal a, b and
// quotient: Vulkan lets OpFDiv be off by 2.5 ulp (with a plain `/`, the int8 pages differed from
// numpy's on llvmpipe and on an H100). The quotient is corrected once by its remainder, then
// replaced by its neighbour towards a / b when that one's remainder is smaller (a quotient of
// floats is never halfway between two floats).
float div_rn(float a, float b) {
    precise float q = a / b;
    q = q + remainder_exact(a, q, b) / b;
    float r = remainder_exact(a, q, b);
    if (r == 0.0) return q;
    bool up = (r > 0.0) == (b > 0.0);  // a / b > q
    uint bits = floatBitsToUint(q);
    float n = uintBitsToFloat(up == (q > 0.0) ? bits + 1u : bits - 1u);
    return abs(remainder_exact(a, n, b)) < abs(r) ? n : q;
}

// The int8 scale of a row whose largest magnitude is `amax`: amax / 127, or 1 when it is 0.
float int8_scale(float amax) { return amax > 0.0 ? div_rn(amax, 127.0) : 1.0; }

// Four values as int8 codes with scale s, rint(x / s) (half to even) clamped to [-127, 127], in one word.
uint pack_int8x4(vec4 x, float s) {
    vec4 q = clamp(roundEven(vec4(div_rn(x.x, s), div_rn(x.y, s), div_rn(x.z, s), div_rn(x.w, s))), -127.0, 127.0);
    uvec4 b = uvec4(ivec4(q)) & 0xffu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}
