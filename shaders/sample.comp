#version 450
// One token per row of logits [R, row_stride] (fp32), by the rule of gemma_batch/backends/sampler.py.
// One workgroup per row.
//
// The rule, for the ids below meta.vocab_limit (L):
//   temperature <= 0 (or NaN): the arg-max of the logits, the lowest id on ties.
//   otherwise y = x / temperature (fp32, correctly rounded), and the candidates in the order
//   (y descending, id ascending), or in id order when no filter is on. top-k keeps the first k;
//   top-p the shortest prefix whose weight reaches top_p times the weight left; min-p drops the
//   weights below min_p times the largest (which is 1); the draw takes the first candidate whose
//   cumulative weight exceeds u times the total, u = (philox4x32_10((counter,0,0,0), key)[0] >> 8) / 2^24.
//   A weight is exp(y - max y), with y - max y in fp32 as in the reference.
//
// Nothing sorts the vocabulary. Every filter keeps a prefix of the order, so the candidate set is
// always a "cut": the elements that come no later than one boundary element (bkey, bid) in the
// order (plus, once min-p is on, the test weight >= min_p). Each filter, and the draw, is one
// question: "which element of the current set is the first whose running total (of counts for
// top-k, of weights for top-p and the draw) reaches a target?". It is answered by radix select:
//   * over the 32-bit order-preserving key of y, 8 bits at a time from the top: a 256-bin
//     histogram of the set's elements whose key starts with the digits chosen so far, scanned in
//     descending digit order, picks the bin where the running total reaches the target (4 levels);
//   * then, among elements with that exact key (ties: same y, same weight), over the bits of the
//     id, 8 at a time from the top, scanned in ascending order (the id order the reference uses).
// The same id-digit select over all ids is the draw when no filter is on (the cumulative order
// is then the id order). Levels stop early when the chosen bin holds a single element.
//
// Exactness and determinism. Weights go into the histograms as 64-bit fixed point, round(w * 2^40)
// (w <= 1, at most 2^19 ids: sums < 2^60), added with 32-bit shared-memory atomics (the carry of
// the low word goes to the high word). Integer sums do not depend on the order of the additions,
// so the atomics make the result deterministic on every device, and a bin's total is exactly the
// sum of its sub-bins one level down: the running totals of all levels agree exactly. Targets are
// exact integers: the draw takes the first candidate with cum > u*T, i.e. cum >= floor(u*T) + 1
// (u has 24 bits, u*T is a 24 x 64-bit product); top-p takes the first with cum >= ceil(p*T) (p
// an fp32 value, an integer times a power of two). The only difference from the float64 reference
// is then each weight's rounding (an fp32 exp accurate to ~2 ulp, then 2^-41 absolute): a draw
// can differ only when u*T or p*T lies within ~1e-7 relative of a cumulative boundary, or a
// weight within ~1e-7 of min_p (see tests/test_vulkan_sampler.py). The max is exact in any order.
//
// Cost: greedy rows read the row once. Sampled rows read it once for the max, then once per key
// level (4 per select, fewer when a bin becomes a single element), once more per tie-breaking id
// select; as soon as the candidate set is known to hold at most CAP elements (after top-k, after
// top-p, or from a histogram's total) it is gathered into shared memory once and every later level
// runs over that list. Without filters: the max, one pass over the ids, two tiny ranges.
#include "common.glsl"

#define WG 1024       // invocations per row
#define BINS 256      // 8-bit digits
#define CAP 2048      // candidates a row can hold in shared memory
#define NONE 0xffffffffu

// What a level-0 scan turns the set's total into.
#define TARGET_GIVEN 0u  // the target passed in (top-k: k)
#define TARGET_DRAW 1u   // floor(u * T) + 1
#define TARGET_TOPP 2u   // max(1, ceil(p * T))

layout(local_size_x = WG) in;

struct RowParams {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint key0;
    uint key1;
    uint counter;
    uint pad;
};

layout(std430, binding = 0) readonly buffer Lb { float logits[]; };
layout(std430, binding = 1) readonly buffer Pb { RowParams params[]; };
layout(std430, binding = 2) writeonly buffer Ob { int ids[]; };

layout(push_constant) uniform Push {
    uint row_stride;
} pc;

shared uint h_cnt[BINS];   // histogram: elements per bin
shared uint h_lo[BINS];    // weight per bin, fixed point, low and high words
shared uint h_hi[BINS];
shared uint h_min[BINS];   // smallest id per bin (key levels after the first)
shared uint s_cnt[BINS];   // inclusive prefix sums in scan order
shared uint s_lo[BINS];
shared uint s_hi[BINS];
shared uint list_id[CAP];  // the gathered candidate set (also the arg-max scratch before that)
shared float list_y[CAP];
shared uint sh_n;
shared uint sh_sel[10];

// Row state: every invocation holds the same values (read from params or from shared memory
// after a barrier), so all control flow below is uniform over the workgroup.
uint g_base, g_L;
float g_t, g_m, g_minp;
bool g_minp_on, g_listed;
uint g_n;            // entries in the list
uint g_ckey, g_cid;  // the cut: key > g_ckey, or key == g_ckey and id <= g_cid
uint g_count;        // elements in the set where known, else NONE
uint g_u24;          // the draw's 24 random bits
float g_p;
uint g_bkey, g_bid, g_brank;  // a select's result: the boundary element and its rank in the set
// A scan's result.
uint r_bin, r_cnt_before, r_cnt_in, r_min, r_tot_cnt;
uvec2 r_w_before, r_tot_w;

// ---- 64-bit unsigned integers as (low, high) words -------------------------------------------
uvec2 add64(uvec2 a, uvec2 b) {
    uint c;
    uint lo = uaddCarry(a.x, b.x, c);
    return uvec2(lo, a.y + b.y + c);
}
uvec2 sub64(uvec2 a, uvec2 b) {
    uint br;
    uint lo = usubBorrow(a.x, b.x, br);
    return uvec2(lo, a.y - b.y - br);
}
bool lt64(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x < b.x); }
bool le64(uvec2 a, uvec2 b) { return a.y < b.y || (a.y == b.y && a.x <= b.x); }

// a * b as a 96-bit number (x, y, z words).
uvec3 mul32x64(uint a, uvec2 b) {
    uint h0, l0, h1, l1, c;
    umulExtended(a, b.x, h0, l0);
    umulExtended(a, b.y, h1, l1);
    uint mid = uaddCarry(h0, l1, c);
    return uvec3(l0, mid, h1 + c);
}
// floor(v / 2^s) (assumed < 2^64), and whether bits were dropped.
uvec2 shr96(uvec3 v, uint s, out bool inexact) {
    if (s >= 96u) { inexact = any(notEqual(v, uvec3(0))); return uvec2(0); }
    uint w = s >> 5, b = s & 31u;
    uint words[4] = uint[4](v.x, v.y, v.z, 0u);
    uint dropped = 0u;
    for (uint i = 0u; i < w; i++) dropped |= words[i];
    if (b != 0u) dropped |= words[w] << (32u - b);
    inexact = dropped != 0u;
    uint a0 = words[w], a1 = w + 1u < 4u ? words[w + 1u] : 0u, a2 = w + 2u < 4u ? words[w + 2u] : 0u;
    if (b == 0u) return uvec2(a0, a1);
    return uvec2((a0 >> b) | (a1 << (32u - b)), (a1 >> b) | (a2 << (32u - b)));
}

// ---- Philox-4x32-10 (Salmon et al., SC'11), as philox4x32 in sampler.py ----------------------
uvec4 philox(uvec4 c, uvec2 k) {
    for (int round_ = 0; round_ < 10; round_++) {
        if (round_ > 0) k += uvec2(0x9E3779B9u, 0xBB67AE85u);
        uint hi0, lo0, hi1, lo1;
        umulExtended(0xD2511F53u, c.x, hi0, lo0);
        umulExtended(0xCD9E8D57u, c.z, hi1, lo1);
        c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

// ---- scaled logits, keys, weights ------------------------------------------------------------
// x / t correctly rounded: the driver's division may be off by 2.5 ulp (Vulkan's bound), and an
// ulp of y moves both the order (new ties) and the weight (by |y| ulp). One fma correction step
// (the residual x - q t is exact) rounds correctly but in astronomically rare cases.
float div_rn(float x, float t) {
    precise float q = x / t;
    if (isinf(q) || q == 0.0) return q;
    precise float r = fma(-q, t, x);
    precise float q2 = fma(r, 1.0 / t, q);
    return q2;
}

float load_y(uint id) {
    float y = div_rn(logits[g_base + id], g_t);
    return y == 0.0 ? 0.0 : y;  // -0 ties with +0, as in the reference
}

// Order-preserving bits: a larger float has a larger key.
uint key_of(float y) {
    uint u = floatBitsToUint(y);
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
float y_of_key(uint k) {
    return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

// exp(d) for d <= 0, within ~2 ulp on any driver (Vulkan's exp may be off by 3 + 2|d| ulp):
// Cody-Waite reduction by ln 2 (k * 0.693359375 is exact for |k| <= 126), then a degree-7
// polynomial on |r| <= 0.35. Exactly 1 at d = 0. Below -87 the weight is 0 (in 2^-40 fixed point
// anything below e^-28.4 is 0 already).
float exp_neg(float d) {
    if (!(d >= -87.0)) return 0.0;
    precise float k = round(d * 1.44269504088896341);
    precise float r = d - k * 0.693359375;
    r = r + k * 2.12194440e-4;
    precise float p = 1.0 + r * (1.0 + r * (0.5 + r * (1.6666667163e-1 + r * (4.1666667908e-2
                    + r * (8.3333337680e-3 + r * (1.3888889225e-3 + r * 1.9841270114e-4))))));
    return ldexp(p, int(k));
}

float weight_of(float y) {
    precise float d = y - g_m;
    return exp_neg(d);
}

// round(w * 2^40) for w in [0, 1], as (low, high) words.
uvec2 fixed40(float w) {
    precise float f = w * 1099511627776.0;  // 2^40: exact
    precise float hf = floor(f * 2.3283064365386963e-10);  // / 2^32: exact
    precise float rest = f - hf * 4294967296.0;  // exact: f without its top bits
    return uvec2(uint(roundEven(rest)), uint(hf));
}

// 64-bit add into a shared bin with 32-bit atomics: the low word's carry goes to the high word.
// Exact in any order of the additions.
void atomic_add64(uint bin, uvec2 w) {
    if (w.x != 0u) {
        uint old = atomicAdd(h_lo[bin], w.x);
        if (old + w.x < old) w.y += 1u;
    }
    if (w.y != 0u) atomicAdd(h_hi[bin], w.y);
}

bool in_cut(uint key, uint id) { return key > g_ckey || (key == g_ckey && id <= g_cid); }

// ---- histograms ------------------------------------------------------------------------------
// Adds the set's elements to the histogram (cleared first).
// Key level (id_level false): elements whose key, above bit shift + 8, equals `prefix`; bin = key
// bits [shift, shift + 8). Id level: elements with id in [lo, lo + 2^bits) (and key == tie_key when
// tie_on); bin = (id - lo) >> shift. Counts always; fixed-point weights when `weighted`.
void build_hist(bool id_level, uint shift, uint prefix, uint lo, uint bits, bool tie_on, uint tie_key,
                bool weighted, bool track_min) {
    uint tid = gl_LocalInvocationID.x;
    if (tid < BINS) {
        h_cnt[tid] = 0u;
        h_lo[tid] = 0u;
        h_hi[tid] = 0u;
        h_min[tid] = NONE;
    }
    if (tid == 0u) sh_sel[0] = NONE;
    barrier();
    uint span = 1u << bits;
    uint begin = 0u, end = g_listed ? g_n : g_L;
    if (id_level && !g_listed) {
        begin = lo;
        end = min(g_L, lo + span);
    }
    for (uint i = begin + tid; i < end; i += WG) {
        uint id;
        float y;
        if (g_listed) {
            id = list_id[i];
            y = list_y[i];
        } else {
            id = i;
            y = load_y(i);
        }
        uint key = key_of(y);
        if (!in_cut(key, id)) continue;
        uint bin;
        if (id_level) {
            if (id < lo || id - lo >= span || (tie_on && key != tie_key)) continue;
            bin = (id - lo) >> shift;
        } else {
            if (shift < 24u && (key >> (shift + 8u)) != prefix) continue;
            bin = (key >> shift) & 255u;
        }
        uvec2 w = uvec2(0u);
        if (weighted || g_minp_on) {
            float wf = weight_of(y);
            if (g_minp_on && !(wf >= g_minp)) continue;
            w = fixed40(wf);
        }
        atomicAdd(h_cnt[bin], 1u);
        if (weighted) atomic_add64(bin, w);
        if (track_min) atomicMin(h_min[bin], id);
    }
    barrier();
}

// The draw's target: floor(u * T) + 1, u = u24 / 2^24.
uvec2 draw_target(uvec2 total) {
    bool inexact;
    return add64(shr96(mul32x64(g_u24, total), 24u, inexact), uvec2(1u, 0u));
}

// top-p's target: ceil(p * T), at least 1; p = m * 2^-s exactly (m < 2^24).
uvec2 topp_target(uvec2 total) {
    if (!(g_p > 0.0)) return uvec2(1u, 0u);
    uint bits = floatBitsToUint(g_p);
    uint e = (bits >> 23) & 255u;
    uint m = e != 0u ? (bits & 0x7fffffu) | 0x800000u : bits & 0x7fffffu;
    uint s = e != 0u ? 150u - e : 149u;  // p < 1: s >= 24
    bool inexact;
    uvec2 t = shr96(mul32x64(m, total), s, inexact);
    if (inexact) t = add64(t, uvec2(1u, 0u));
    return (t.x | t.y) == 0u ? uvec2(1u, 0u) : t;
}

// Scans the histogram in select order (bins descending for keys, ascending for ids) and picks the
// bin where the running total (count, or weight when `weighted`) first reaches `rem`:
// total before it < rem <= total through it. Level 0 first sets `rem` from the set's total.
// Sums are integers: any scan order gives the same result (Hillis-Steele, 8 steps).
void scan_choose(bool descending, bool weighted, uint kind, inout uvec2 rem) {
    uint tid = gl_LocalInvocationID.x;
    uint b = 0u, c = 0u;
    uvec2 w = uvec2(0u);
    if (tid < BINS) {
        b = descending ? BINS - 1u - tid : tid;
        c = h_cnt[b];
        w = uvec2(h_lo[b], h_hi[b]);
        s_cnt[tid] = c;
        s_lo[tid] = w.x;
        s_hi[tid] = w.y;
    }
    uint ci = c;
    uvec2 wi = w;
    for (uint off = 1u; off < BINS; off <<= 1) {
        barrier();
        uint ac = 0u;
        uvec2 aw = uvec2(0u);
        if (tid < BINS && tid >= off) {
            ac = s_cnt[tid - off];
            aw = uvec2(s_lo[tid - off], s_hi[tid - off]);
        }
        barrier();
        if (tid < BINS) {
            ci += ac;
            wi = add64(wi, aw);
            s_cnt[tid] = ci;
            s_lo[tid] = wi.x;
            s_hi[tid] = wi.y;
        }
    }
    barrier();
    r_tot_cnt = s_cnt[BINS - 1u];
    r_tot_w = uvec2(s_lo[BINS - 1u], s_hi[BINS - 1u]);
    if (kind == TARGET_DRAW) rem = draw_target(r_tot_w);
    else if (kind == TARGET_TOPP) rem = topp_target(r_tot_w);
    if (tid < BINS) {
        uvec2 inc = weighted ? wi : uvec2(ci, 0u);
        uvec2 exc = sub64(inc, weighted ? w : uvec2(c, 0u));
        if (lt64(exc, rem) && le64(rem, inc)) {  // exactly one bin, when rem <= the total
            uvec2 wb = sub64(wi, w);
            sh_sel[0] = b;
            sh_sel[1] = ci - c;
            sh_sel[2] = wb.x;
            sh_sel[3] = wb.y;
            sh_sel[4] = c;
            sh_sel[5] = h_min[b];
        }
    }
    barrier();
    r_bin = sh_sel[0];
    r_cnt_before = sh_sel[1];
    r_w_before = uvec2(sh_sel[2], sh_sel[3]);
    r_cnt_in = sh_sel[4];
    r_min = sh_sel[5];
    barrier();  // sh_sel is written again by the next histogram
}

// Copies the set (at most CAP elements) into shared memory; later passes read only that.
void gather() {
    uint tid = gl_LocalInvocationID.x;
    if (tid == 0u) sh_n = 0u;
    barrier();
    for (uint i = tid; i < g_L; i += WG) {
        float y = load_y(i);
        uint key = key_of(y);
        if (!in_cut(key, i)) continue;
        if (g_minp_on && !(weight_of(y) >= g_minp)) continue;
        uint pos = atomicAdd(sh_n, 1u);
        if (pos < CAP) {  // always: the set was counted
            list_id[pos] = i;
            list_y[pos] = y;
        }
    }
    barrier();
    g_n = min(sh_n, uint(CAP));
    g_listed = true;
}

void maybe_gather() {
    if (!g_listed && g_count <= uint(CAP)) gather();
}

// The first element in id order (among the set's elements, with key == tie_key when tie_on)
// whose running total reaches the target. Sets g_bid and g_brank (its rank among those elements).
bool id_select(bool tie_on, uint tie_key, bool weighted, uint kind, uvec2 rem) {
    uint bits = g_L <= 1u ? 1u : uint(findMSB(g_L - 1u)) + 1u;  // ids < 2^bits
    uint lo = 0u, above = 0u;
    bool first = true;
    for (;;) {
        uint shift = bits > 8u ? bits - 8u : 0u;
        build_hist(true, shift, 0u, lo, bits, tie_on, tie_key, weighted, false);
        scan_choose(false, weighted, first ? kind : TARGET_GIVEN, rem);
        if (r_bin == NONE) return false;
        rem = sub64(rem, weighted ? r_w_before : uvec2(r_cnt_before, 0u));
        above += r_cnt_before;
        lo += r_bin << shift;
        first = false;
        if (shift == 0u) break;
        bits = shift;
    }
    g_bid = lo;
    g_brank = above + 1u;
    return true;
}

// The first element of the set in (key descending, id ascending) order whose running total
// reaches the target. Sets g_bkey, g_bid, g_brank.
bool key_select(bool weighted, uint kind, uvec2 rem) {
    uint prefix = 0u, above = 0u;
    for (uint level = 0u; level < 4u; level++) {
        uint shift = 24u - 8u * level;
        build_hist(false, shift, prefix, 0u, 0u, false, 0u, weighted, level > 0u);
        scan_choose(true, weighted, level == 0u ? kind : TARGET_GIVEN, rem);
        if (r_bin == NONE) return false;
        rem = sub64(rem, weighted ? r_w_before : uvec2(r_cnt_before, 0u));
        above += r_cnt_before;
        prefix = (prefix << 8) | r_bin;
        if (level == 0u) {
            g_count = r_tot_cnt;  // the set's size, exactly
            maybe_gather();
        } else if (r_cnt_in == 1u) {  // a single element left: it is the boundary
            g_bid = r_min;
            g_bkey = key_of(load_y(r_min));
            g_brank = above + 1u;
            return true;
        }
    }
    // The whole key is known; its elements tie (same y, same weight) and go in id order.
    g_bkey = prefix;
    uvec2 first = weighted ? fixed40(weight_of(y_of_key(prefix))) : uvec2(1u, 0u);
    if (r_cnt_in == 1u || le64(rem, first)) {
        g_bid = r_min;
        g_brank = above + 1u;
        return true;
    }
    if (!id_select(true, prefix, weighted, TARGET_GIVEN, rem)) return false;
    g_brank += above;
    return true;
}

void main() {
    uint r = linear_group();
    if (r >= meta.num_rows) return;
    uint tid = gl_LocalInvocationID.x;
    RowParams prm = params[r];
    g_base = r * pc.row_stride;
    g_L = min(meta.vocab_limit, pc.row_stride);
    g_t = prm.temperature;
    bool sampled = g_t > 0.0;

    // Pass 0: the arg-max (lowest id on ties) of x for greedy rows, of y = x / t for sampled
    // rows (y's maximum is needed for the weights). Max is exact in any order.
    float bv = -1.0 / 0.0;
    uint bi = NONE;
    for (uint i = tid; i < g_L; i += WG) {
        float v = sampled ? load_y(i) : logits[g_base + i];
        if (v > bv || bi == NONE) {  // ids rise along the loop: the first maximum is kept
            bv = v;
            bi = i;
        }
    }
    list_y[tid] = bv;
    list_id[tid] = bi;
    barrier();
    for (uint half_ = WG / 2u; half_ > 0u; half_ >>= 1) {
        if (tid < half_) {
            float v = list_y[tid + half_];
            uint i = list_id[tid + half_];
            if (i != NONE && (list_id[tid] == NONE || v > list_y[tid] || (v == list_y[tid] && i < list_id[tid]))) {
                list_y[tid] = v;
                list_id[tid] = i;
            }
        }
        barrier();
    }
    uint top1 = list_id[0];
    g_m = list_y[0];
    barrier();  // the scratch becomes the candidate list
    if (g_L == 0u) top1 = 0u;
    if (!sampled || g_L <= 1u || prm.top_k == 1) {
        if (tid == 0u) ids[r] = int(top1);
        return;
    }

    g_u24 = philox(uvec4(prm.counter, 0u, 0u, 0u), uvec2(prm.key0, prm.key1)).x >> 8;
    g_p = prm.top_p;
    g_minp = prm.min_p;
    g_minp_on = false;
    g_listed = false;
    g_ckey = 0u;  // every key: the whole vocabulary
    g_cid = NONE;
    g_count = g_L;
    g_bid = top1;
    bool top_k_on = prm.top_k > 0 && uint(prm.top_k) < g_L;
    bool top_p_on = prm.top_p < 1.0;
    bool ok = true;

    if (!(prm.top_k > 0 || top_p_on || prm.min_p > 0.0)) {
        // No filter: the draw runs over the ids in order.
        ok = id_select(false, 0u, true, TARGET_DRAW, uvec2(0u));
    } else {
        if (top_k_on) {
            ok = key_select(false, TARGET_GIVEN, uvec2(uint(prm.top_k), 0u));
            g_ckey = g_bkey;
            g_cid = g_bid;
            g_count = uint(prm.top_k);
        }
        if (ok && top_p_on) {
            maybe_gather();
            ok = key_select(true, TARGET_TOPP, uvec2(0u));
            g_ckey = g_bkey;
            g_cid = g_bid;
            g_count = g_brank;
        }
        if (ok && g_count > 1u) {  // one candidate left (min-p keeps the first): it is the draw
            if (prm.min_p > 0.0) {
                g_minp_on = true;
                g_count = NONE;
            }
            maybe_gather();
            ok = key_select(true, TARGET_DRAW, uvec2(0u));
        }
    }
    if (tid == 0u) ids[r] = int(ok ? g_bid : top1);
}
