// The K and V page buffers (bindings 6 and 8) as a kernel reads them, and LOAD8, one piece of a row
// widened to fp32 (kv_pages.glsl gives the layout). Included after common.glsl and kv_pages.glsl by
// attention.comp and attention_flash.comp, which define PAGE_ACCESS (readonly, or coherent where the
// kernel writes the pages too) and use `hd8` (pieces of 8 per row) and `hd` where LOAD8 expands.
// LOAD8: piece `piece` (elements 8 piece .. 8 piece + 7) of page row `row` (slot * nkv + j), as two vec4.
#if defined(KV_F16) || defined(KV_BF16)
layout(std430, binding = 6) PAGE_ACCESS buffer Kb { uvec4 k4[]; };  // [slots, nkv, hd / 8]
layout(std430, binding = 8) PAGE_ACCESS buffer Vb { uvec4 v4[]; };
#ifdef KV_F16
#define LOAD8(buf, row, piece, lo, hi) { uvec4 w_ = buf[(row) * hd8 + (piece)]; \
    lo = vec4(unpackHalf2x16(w_.x), unpackHalf2x16(w_.y)); hi = vec4(unpackHalf2x16(w_.z), unpackHalf2x16(w_.w)); }
#else
#define LOAD8(buf, row, piece, lo, hi) { uvec4 w_ = buf[(row) * hd8 + (piece)]; \
    lo = vec4(bf16_lo(w_.x), bf16_hi(w_.x), bf16_lo(w_.y), bf16_hi(w_.y)); \
    hi = vec4(bf16_lo(w_.z), bf16_hi(w_.z), bf16_lo(w_.w), bf16_hi(w_.w)); }
#endif
#elif defined(KV_I8)
layout(std430, binding = 6) PAGE_ACCESS buffer Kb { uint k4[]; };   // [slots * nkv, hd / 4 + 1] words
layout(std430, binding = 8) PAGE_ACCESS buffer Vb { uint v4[]; };
#define LOAD8(buf, row, piece, lo, hi) { uint r_ = (row) * kv_i8_row_words(hd); \
    float s_ = uintBitsToFloat(buf[r_ + 2u * hd8 + 8u * (piece) / kv_i8_group(hd)]); \
    lo = int8x4(buf[r_ + 2u * (piece)]) * s_; hi = int8x4(buf[r_ + 2u * (piece) + 1u]) * s_; }
#else
layout(std430, binding = 6) PAGE_ACCESS buffer Kb { vec4 k4[]; };   // [slots, nkv, hd / 4]
layout(std430, binding = 8) PAGE_ACCESS buffer Vb { vec4 v4[]; };
#define LOAD8(buf, row, piece, lo, hi) { uint i_ = 2u * ((row) * hd8 + (piece)); lo = buf[i_]; hi = buf[i_ + 1u]; }
#endif
