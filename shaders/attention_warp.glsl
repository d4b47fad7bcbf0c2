// attention.comp's chunk on its subgroups (WARP_KEYS; included after its buffers, push constants
// and shared arrays). Every subgroup runs its own online softmax over its blocks of the chunk's keys,
// with no barrier between blocks; the subgroups' (m, l, acc) are then added in subgroup order.
//
// Lanes: a key row is hd8 pieces of 8, one a lane, so a subgroup of SG lanes holds KR = SG / hd8
// keys side by side (the host: hd8 a power of two no larger than SG). A block is KW keys a lane,
// KW KR keys a subgroup: key base + i KR + kr for lane slot kr = lane / hd8, i < KW; the subgroup
// s of NS takes blocks s, s + NS, ... of the chunk, all K and V loads of a block issued first.
// The pieces stay as stored (fp16 or bf16 pairs) until used.
// Sums: a key's score is the lane's dot product over its piece, then an xor butterfly over the
// hd8 lanes; a block's probabilities are added over i in the lane, then over kr by butterfly;
// acc likewise (over i as the block goes, over kr at the end). The order depends only on the
// chunk's keys, hd and SG, never on the batch.

#ifndef KW
#define KW 8   // keys a lane loads at once
#endif
const uint GW = GMAX < 4u ? GMAX : 4u;  // query heads per kv head, at most, on this path (host: kernels)
shared vec4 wacc[GW * 64];        // [G, hd / 4]: the chunk's acc, the subgroups' added in order
shared float wm[WG / 8u * GW];    // [NS, G]: each subgroup's m (subgroups of 8 or more)
shared float wl[WG / 8u * GW];    // [NS, G]: and l

#if defined(KV_F16)
#define WIDEN8(p_, lo, hi) { lo = vec4(unpackHalf2x16(p_.x), unpackHalf2x16(p_.y)); hi = vec4(unpackHalf2x16(p_.z), unpackHalf2x16(p_.w)); }
#else
#define WIDEN8(p_, lo, hi) { lo = vec4(bf16_lo(p_.x), bf16_hi(p_.x), bf16_lo(p_.y), bf16_hi(p_.y)); \
    hi = vec4(bf16_lo(p_.z), bf16_hi(p_.z), bf16_lo(p_.w), bf16_hi(p_.w)); }
#endif

// The chunk [k0, k1) of kv head j for the queries in qs: its m and l in run_max / run_sum and its
// unnormalised output in wacc ([G, hd8, 2] vec4, as o4), all written when it returns.
void warp_chunk(uint table, uint j, uint k0, uint k1, uint G, uint hd8) {
    uint SG = gl_SubgroupSize, NS = gl_NumSubgroups, s = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint KR = SG / hd8, piece = lane % hd8, kr = lane / hd8, nkv = NUM_KV_HEADS, span = KW * KR;
    barrier();  // qs written; the last chunk's wacc, run_max and run_sum read
    float m[GW], l[GW];
    vec4 alo[GW], ahi[GW];  // head g's elements 8 piece .. 8 piece + 7
    vec4 qlo[GW], qhi[GW];
    [[unroll]] for (uint g = 0u; g < GW; g++) {
        m[g] = NEG; l[g] = 0.0; alo[g] = vec4(0.0); ahi[g] = vec4(0.0);
        if (g >= G) break;
        qlo[g] = qs[2u * (g * hd8 + piece)];
        qhi[g] = qs[2u * (g * hd8 + piece) + 1u];
    }
    for (uint base = k0 + s * span; base < k1; base += NS * span) {
        uvec4 kw[KW], vw[KW];
#ifdef V_LATE
        uint rows[KW];
#endif
        [[unroll]] for (uint i = 0u; i < KW; i++) {
            uint key = min(base + i * KR + kr, k1 - 1u);
            uint row = (uint(block_table[table + key / BLOCK_SIZE]) * BLOCK_SIZE + key % BLOCK_SIZE) * nkv + j;
            kw[i] = k4[row * hd8 + piece];
#ifdef V_LATE
            rows[i] = row;
#else
            vw[i] = v4[row * hd8 + piece];
#endif
        }
        float sc_[KW * GW];  // scores, then probabilities: [i, g]
        [[unroll]] for (uint i = 0u; i < KW; i++) {
            vec4 klo, khi;
            WIDEN8(kw[i], klo, khi);
            [[unroll]] for (uint g = 0u; g < GW; g++) {
                if (g >= G) break;
                float d = dot(qlo[g], klo) + dot(qhi[g], khi);
                for (uint b = 1u; b < hd8; b <<= 1) d += subgroupShuffleXor(d, b);
                sc_[i * GW + g] = base + i * KR + kr < k1 ? d : NEG;
            }
        }
        [[unroll]] for (uint g = 0u; g < GW; g++) {
            if (g >= G) break;
            float mx = NEG;
            [[unroll]] for (uint i = 0u; i < KW; i++) mx = max(mx, sc_[i * GW + g]);
            float m_new = max(m[g], subgroupMax(mx));
            float r = exp(m[g] - m_new), sum = 0.0;
            [[unroll]] for (uint i = 0u; i < KW; i++) {
                float e = base + i * KR + kr < k1 ? exp(sc_[i * GW + g] - m_new) : 0.0;
                sc_[i * GW + g] = e;
                sum += e;
            }
            for (uint b = hd8; b < SG; b <<= 1) sum += subgroupShuffleXor(sum, b);
            l[g] = l[g] * r + sum;
            m[g] = m_new;
            alo[g] *= r;
            ahi[g] *= r;
        }
#ifdef V_LATE
        [[unroll]] for (uint i = 0u; i < KW; i++) vw[i] = v4[rows[i] * hd8 + piece];
#endif
        [[unroll]] for (uint i = 0u; i < KW; i++) {
            vec4 vlo, vhi;
            WIDEN8(vw[i], vlo, vhi);
            [[unroll]] for (uint g = 0u; g < GW; g++) {
                if (g >= G) break;
                alo[g] += sc_[i * GW + g] * vlo;
                ahi[g] += sc_[i * GW + g] * vhi;
            }
        }
    }
    [[unroll]] for (uint g = 0u; g < GW; g++) {
        if (g >= G) break;
        for (uint b = hd8; b < SG; b <<= 1) {
            alo[g] += subgroupShuffleXor(alo[g], b);
            ahi[g] += subgroupShuffleXor(ahi[g], b);
        }
    }
    // The subgroups' records, weighted by e^(m_s - M) and added in subgroup order.
    [[unroll]] for (uint g = 0u; g < GW; g++) {  // (m and l are the same in every lane)
        if (g >= G) break;
        if (lane == g) {
            wm[s * GW + g] = m[g];
            wl[s * GW + g] = l[g];
        }
    }
    barrier();
    [[unroll]] for (uint g = 0u; g < GW; g++) {
        if (g >= G) break;
        float M = NEG;
        for (uint u = 0u; u < NS; u++) M = max(M, wm[u * GW + g]);
        float w = exp(m[g] - M);
        alo[g] *= w;
        ahi[g] *= w;
        if (s == 0u && lane == g) {
            float L = 0.0;
            for (uint u = 0u; u < NS; u++) L += wl[u * GW + g] * exp(wm[u * GW + g] - M);
            run_max[g] = M;
            run_sum[g] = L;
        }
    }
    for (uint u = 0u; u < NS; u++) {
        if (s == u && kr == 0u) {
            [[unroll]] for (uint g = 0u; g < GW; g++) {
                if (g >= G) break;
                uint e = 2u * (g * hd8 + piece);
                wacc[e] = u == 0u ? alo[g] : wacc[e] + alo[g];
                wacc[e + 1u] = u == 0u ? ahi[g] : wacc[e + 1u] + ahi[g];
            }
        }
        barrier();
    }
}
