// One head of the fused [q | k | v] projection made ready for attention: q and k heads
// RMS-normalised with (1 + q_norm / k_norm) and rotated (rotate-half RoPE, angle
// fp32(position * inv_freq[i]), range-reduced sin/cos); k and v heads stored into the KV pages
// (kv_pages.glsl), rounded as kv_formats.py says (KV_I8: a scale per group of the head's values). Both places that do this run these functions, so a head has the same bits
// either way: the qkv matmul's epilogue (matmul_epilogue.glsl EPI_QK_ROPE, after matmul.comp
// and reduce.comp) and attention.comp's QK_IN prologue (decode steps on the cooperative path).
//
// The includer declares WG (at least head_dim / 2 invocations), g_epi (q_norm then k_norm,
// [2 hd]), inv_freq ([hd / 2]) and the pages kpage / vpage (float with KV_F32, else 32-bit
// words), and includes workgroup.glsl. Barriers inside: call from uniform control flow.

#define HD_MAX 256
#ifndef QK_VALS
#define QK_VALS HD_MAX
#endif
shared float vals[QK_VALS];  // the head's hd values (attention.comp: several heads, HD_MAX apart)
#ifdef KV_I8
shared float kv_scales[HD_MAX / 32];  // a row's int8 scales (kv_i8_group: at most hd / 32 of them)
#endif

// The pieces of the arithmetic, written so that both places get the same bits from the same
// values: `precise` (no fused multiply-adds the compiler may or may not form), and no division
// or square root, which Vulkan lets two kernels round differently (common.glsl's rcp_det, rsqrt_det).
// An invocation's sum of squares of its values d = tid, tid + WG (0 past hd; hd <= 2 WG) ...
float sum_squares(float v0, float v1) {
    precise float s = v0 * v0 + v1 * v1;
    return s;
}
// ... 1 / the head's RMS, from the workgroup's sum of those ...
float qk_inv_rms(float total, uint hd, float eps) {
    precise float m = total * rcp_det(float(hd)) + eps;
    return rsqrt_det(m);
}
// ... and elements d, d + hd / 2 normalised with weights (1 + g0, 1 + g1) and rotated by the angle
// whose (sin, cos) is sc.
vec2 norm_rope_pair(float x0, float x1, float inv_rms, float g0, float g1, vec2 sc) {
    precise float a = x0 * inv_rms * (1.0 + g0), b = x1 * inv_rms * (1.0 + g1);
    precise vec2 r = vec2(a * sc.y - b * sc.x, b * sc.y + a * sc.x);  // x[d] cos - x[d + half] sin, x[d + half] cos + x[d] sin
    return r;
}

// QK-norm and RoPE of vals[0, hd) in place, for a head whose norm weights start at g_epi[wofs]
// (0 for q, hd for k), at `position`.
void norm_rope(uint hd, uint wofs, float eps, int position) {
    uint tid = gl_LocalInvocationID.x, half_hd = hd / 2;
    float inv_rms = qk_inv_rms(workgroup_sum(sum_squares(tid < hd ? vals[tid] : 0.0, tid + WG < hd ? vals[tid + WG] : 0.0)), hd, eps);
    vec2 r = vec2(0.0);
    if (tid < half_hd) {
        vec2 sc = sincos_reduced(float(position) * inv_freq[tid]);
        r = norm_rope_pair(vals[tid], vals[tid + half_hd], inv_rms, g_epi[wofs + tid], g_epi[wofs + tid + half_hd], sc);
    }
    barrier();
    if (tid < half_hd) {
        vals[tid] = r.x;
        vals[tid + half_hd] = r.y;
    }
    barrier();
}

// vals[at, at + hd) into page row `row` (slot * nkv + kv head) of V (is_v) or K.
void store_page_row(uint row, uint hd, bool is_v, uint at) {
    uint tid = gl_LocalInvocationID.x;
#define STORE(at, value) { if (is_v) vpage[at] = value; else kpage[at] = value; }
#if defined(KV_F16) || defined(KV_BF16)
    for (uint d = 2 * tid; d < hd; d += 2 * WG) {
        vec2 pair = vec2(vals[at + d], vals[at + d + 1]);
#ifdef KV_F16
        STORE((row * hd + d) / 2, packHalf2x16(clamp(pair, -65504.0, 65504.0)));
#else
        STORE((row * hd + d) / 2, pack_bf16x2(pair));
#endif
    }
#elif defined(KV_I8)
    // One invocation a group (WG >= hd / 2 >= the groups) finds its scale, then every one packs.
    uint g = kv_i8_group(hd), word = row * kv_i8_row_words(hd);
    if (tid < hd / g) {
        float mx = 0.0;
        for (uint d = tid * g; d < (tid + 1u) * g; d++) mx = max(mx, abs(vals[at + d]));
        kv_scales[tid] = int8_scale(mx);
        STORE(word + hd / 4 + tid, floatBitsToUint(kv_scales[tid]));
    }
    barrier();
    for (uint d = 4 * tid; d < hd; d += 4 * WG) {
        STORE(word + d / 4, pack_int8x4(vec4(vals[at + d], vals[at + d + 1], vals[at + d + 2], vals[at + d + 3]), kv_scales[d / g]));
    }
    barrier();  // (kv_scales is read before the next row's scales are written)
#else
    for (uint d = tid; d < hd; d += WG) STORE(row * hd + d, vals[at + d]);
#endif
#undef STORE
}
