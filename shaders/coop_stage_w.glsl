// The weight staging of matmul_coop.comp (included after its tile defines BN, KU, KBS, PAD and WG,
// and min8.glsl):
// what a staged piece of W is for each weight layout, where piece e comes from (W_AT) and goes
// to in shared memory (W_SH), its scale (LOAD_SCALE, expanded in main, which declares wsc,
// scale_base, wrow0, up and, for W_Q4 / W_Q5, qstep) and its conversion to fp16 (to_fp16).

// A staged piece: WQ consecutive weights of a row, WORDS words of 8 weights each (the unit every
// layout's LOAD / to_fp16 works in). int4 / int5 codes are staged in pieces of 32 (16 bytes) where
// the tile has a piece per invocation, else 16: a group (32, 64 or 128 weights) then holds whole
// pieces, so each piece reads its group's pair and its fifth bits once. On the H200, 4b int4
// decode at batch 1 / 32: 143 / 4,430 tok/s in pieces of 8, 167.5 / 5,083 in pieces of 32, 176.8 /
// 5,253 with codes8's byte-wise decoding (and no x loads for row tiles past M); stages of 128 k
// instead of 64: 118.7 (docs/EXPERIMENTS.md, "int4 staged in pieces of 32").
#if defined(W_I4) || defined(W_Q4) || defined(W_Q5)
#define W_4BIT
#if BN * KU / WG >= 32
#define WQ 32
#define WPIECE uvec4
#else
#define WQ 16
#define WPIECE uvec2
#endif
#elif defined(W_I8) || defined(W_T8)
#define WQ 8
#define WPIECE uvec2
#else
#define WQ 8
#define WPIECE uvec4
#endif
#define WORDS (WQ / 8)  // 8-weight pieces (to_fp16's unit) in a staged piece
#define XQ (KU / WQ)    // staged pieces of a W row per stage

#define W_LOADS (BN * XQ / WG)       // staged pieces of W per invocation per stage
#if defined(W_I8) || defined(W_T8)
#define W_BYTES_PER_8 8
#elif defined(W_I4) || defined(W_Q4) || defined(W_Q5)
#define W_BYTES_PER_8 4
#else
#define W_BYTES_PER_8 16
#endif
// Where staged piece e (WQ weights: row e / XQ of the stage, k WQ (e % XQ) on) comes from and goes to
// (its 8-weight pieces: W_SH(e) on).
#if defined(W_T16) || defined(W_T8)  // pieces in tile order: tile t = e / 32 of the stage (output tile t / KBS, k block t % KBS),
// its row (e % 32) / 2 (row-major), or lane e % 32 (fragment order: W_T8, or W_T16 with FRAGMENT_LOADS)
#define W_AT(e, k0) ((((wrow0 / 16) + (e) / (32 * KBS)) * (pc.K / 16) + (k0) / 16 + ((e) / 32) % KBS) * 32 + (e) % 32)
#define W_SH(e) ((((e) / (32 * KBS)) * 16 + ((e) % 32) / 2) * PAD + (((e) / 32) % KBS) * 2 + (e) % 2)
#ifdef W_T8
#define PIECE_FRAGMENTS true
#else
#define PIECE_FRAGMENTS FRAGMENT_LOADS
#endif
#else
#define W_AT(e, k0) ((wrow0 + (e) / XQ) * (pc.K / WQ) + (k0) / WQ + (e) % XQ)
#define W_SH(e) (((e) / XQ) * PAD + ((e) % XQ) * WORDS)
#endif

#ifdef W_4BIT
#define W8 uint         // to_fp16's 8 weights: a word of codes
#define WORD(v, j) (v)[j]
#else
#define W8 WPIECE
#endif
uvec4 to_fp16(W8 v, vec2 scale, uint high) {  // 8 weights of W's storage type as 8 fp16 (scale: quantized W's
    // scale, minimum; high: W_Q5's fifth bits)
#if defined(W_I8)
    return int8_fp16_8(v, scale.xx);
#elif defined(W_T8)  // scale: (row g, row g + 8) of the lane's fragment
    return int8_fp16_8(v, scale);
#elif defined(W_4BIT)
    vec4 e, o;  // codes 0, 2, 4, 6 and 1, 3, 5, 7
#ifdef W_Q5
    codes8(v, high, e, o);
#else
    codes8(v, 0u, e, o);
#endif
    e = e * scale.x + scale.y;
    o = o * scale.x + scale.y;
    return uvec4(fp16_pair(e.x, o.x), fp16_pair(e.y, o.y), fp16_pair(e.z, o.z), fp16_pair(e.w, o.w));
#else
    return v;
#endif
}

#if defined(W_T8)
#define LOAD_SCALE(i, e, k0) { uint s_ = scale_base + (((wrow0 / 16 + (e) / (32 * KBS)) * 8 + ((e) % 32) / 4) * (pc.K / 32) \
                                               + ((k0) / 16 + ((e) / 32) % KBS) / 2); \
    wsc[i] = unpackHalf2x16(up ? u_scales[s_] : w_scales[s_]); }
#elif defined(W_I8)
#define LOAD_SCALE(i, e, k0) { uint row_ = wrow0 + (e) / XQ, g_ = row_ * (pc.K / INT8_GROUP) + ((k0) + WQ * ((e) % XQ)) / INT8_GROUP; \
    uint pair_ = up ? u_scales[scale_base + g_ / 2] : w_scales[scale_base + g_ / 2]; \
    wsc[i] = vec2(half_of(pair_, g_ & 1u), 0.0); }
#elif defined(W_I4)
#define LOAD_SCALE(i, e, k0) { uint g_ = (wrow0 + (e) / XQ) * (pc.K / pc.group) + ((k0) + WQ * ((e) % XQ)) / pc.group; \
    wsc[i] = unpackHalf2x16(up ? u_scales[scale_base + g_] : w_scales[scale_base + g_]); }
#elif defined(W_Q4) || defined(W_Q5)  // (min8.glsl) the group's pair with its row's steps (qstep), W_Q5: the piece's fifth bits
#define Q_SIDE_ROW(e) (scale_base + (wrow0 + (e) / XQ) * Q_SIDE_WORDS(pc.K, pc.group))
#define LOAD_SCALE(i, e, k0) { uint row_ = Q_SIDE_ROW(e), k8_ = (k0) / 8 + ((e) % XQ) * WORDS; \
    uint g_ = k8_ * 8u / pc.group, at_ = row_ + Q_PAIR_WORD(pc.K, g_); \
    wsc[i] = min8_pair(qstep[i], up ? u_scales[at_] : w_scales[at_], g_); \
    LOAD_HIGH(i, row_ + 1u + k8_ / 4u, k8_) }
#else
#define LOAD_SCALE(i, e, k0)
#endif
