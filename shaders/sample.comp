#version 450
// One token per row of logits [R, row_stride] (fp32), by the rule of gemma_batch/backends/sampler.py.
// One workgroup per row.
//
// The rule, for the ids below meta.vocab_limit (L) that the row's grammar mask allows (a row
// with `mask` > 0 reads word w of its mask, masks[(mask - 1) * ceil(row_stride / 32) + w], bit j
// allowing id 32 w + j; the others count as logits of -inf, as in the reference):
//   temperature <= 0 (or NaN): the arg-max of the logits, the lowest id on ties.
//   A row whose logits (those the mask allows, below L) hold a NaN or +inf gets NON_FINITE (-2,
//   backends/base.py): the weights are corrupt or the arithmetic overflowed, and the engine stops.
//   otherwise y = x / temperature (fp32, correctly rounded), the weight of an id is
//   exp(y - max y) (the difference in fp32, as in the reference), and the candidates go in the
//   order (y descending, id ascending), or in id order when no filter is on. top-k keeps the first
//   k; top-p the shortest prefix whose weight reaches top_p times the weight left; min-p drops the
//   weights below min_p times the largest (which is 1); the draw takes the first candidate whose
//   cumulative weight exceeds u times the total, u = (philox4x32_10((counter,0,0,0), key)[0] >> 8) / 2^24.
//
// Nothing sorts the vocabulary. Every filter keeps a prefix of the order, so the candidate set is
// a "cut": the elements no later in the order than a boundary element (plus, once min-p is on,
// the test weight >= min_p). Each filter, and the draw, asks one question: which element of the
// set is the first whose running total (a count for top-k, a weight for top-p and the draw)
// reaches a target? Radix select answers it, one level at a time: a 256-bin histogram of the
// set's elements in the bin chosen so far, scanned in the order's direction, picks the bin where
// the running total reaches the target. The levels, each bin a contiguous stretch of the order:
//   * distance (weighted selects first): bin = floor((max y - y) * 8), the last bin 255 holding
//     everything below e^-31.9 (weight 0 here). Near the top of a row a bin of 1/8 logit holds
//     few ids, so the chosen bin usually fits in shared memory after one pass;
//   * key: the 32-bit order-preserving bits of y, 8 at a time from the top (top-k starts here;
//     pass 0 builds its first histogram);
//   * id, among equal keys (ties: same y, same weight), 8 bits at a time, ascending.
// The id levels over all ids are also the draw when no filter is on (the order is then id order).
// A level stops the select when its bin holds one element. Whenever a set, or everything up to
// the chosen bin, or the chosen bin alone, is known to hold at most CAP elements, one pass copies
// those into shared memory and the levels after it read the copy instead of the row.
//
// Exactness and determinism. Weights enter the histograms as 64-bit fixed point, round(w * 2^40)
// (w <= 1, at most 2^19 ids: sums < 2^60), added with 32-bit shared-memory atomics (the low
// word's carry goes to the high word). Integer sums do not depend on the order of the additions,
// so the result is the same on every run, and a bin's total is exactly the sum of its sub-bins:
// the running totals of all levels agree exactly. Targets are exact integers too: the draw takes
// the first candidate with cum > u*T, i.e. cum >= floor(u*T) + 1 (u has 24 bits: u*T is a
// 24 x 64-bit product); top-p the first with cum >= ceil(p*T) (p is an fp32 value, an integer
// times a power of two). The max is exact in any order. So the draw differs from the float64
// reference only through each weight's rounding (the fp32 exp below is within 1.02e-7 relative,
// the fixed point within 2^-41): only where u*T or p*T lies within ~2e-7 relative of a
// cumulative boundary, or a weight within ~1e-7 of min_p (tests/test_vulkan_sampler.py). An
// element whose fixed-point weight is 0 never holds a weighted boundary, so weighted histograms
// and copies skip it.
//
// Cost. A row has one workgroup, so a pass over it is bound by arithmetic per element more than
// by memory. Every pass first skips, on x alone, the elements whose y provably lies outside what
// it can accept (the cut, positive weight, min-p, the bin being resolved), so only the first pass
// of a select computes weights for the whole row. Greedy: 1 pass. Sampled: pass 0 (the max; for
// top-k rows also the first key level), then no filter: 1 weighted pass and two small id ranges;
// top-k: usually 2 cheap passes, then shared memory; top-p: the distance level (1 weighted pass)
// and a copy, and the draw after it reuses that histogram (its total is the cumulative weight
// through top-p's boundary) and needs a copy at most; min-p: 1 weighted pass and a copy. Heavy
// ties at a boundary cost more (key and id levels over the row). Measured on an H100 (NVIDIA's
// Vulkan driver, 32 rows of 262,144 synthetic logits): greedy 30 us before its arg-max loaded 8 vec4
// at a time (in a 4b decode step now 22-25 us at batch 1 and 32, against 31-43); temperature alone 160-200;
// top-k 50 135; top-p 0.9 310-330; min-p 0.05 135-165; top-k 40 + top-p 0.95 + min-p 150.
#extension GL_EXT_control_flow_attributes : require  // [[unroll]]: pass 0's loads stay in registers
#include "common.glsl"

#define WG 1024         // invocations per row
#define BINS 256        // 8-bit digits
#define CAP 2048        // elements a row can copy into shared memory
#define NONE 0xffffffffu
#define NON_FINITE -2   // the id of a row whose logits are not all finite
#define ARGMAX_LOADS 8  // vec4 loads in flight per invocation in pass 0's arg-max

// What the first level's scan turns the set's total into.
#define TARGET_GIVEN 0u  // the target passed in (top-k: k)
#define TARGET_DRAW 1u   // floor(u * T) + 1
#define TARGET_TOPP 2u   // max(1, ceil(p * T))

// Kinds of level.
#define LVL_KEY 0u
#define LVL_DIST 1u
#define LVL_ID 2u

layout(local_size_x = WG) in;

struct RowParams {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    uint key0;
    uint key1;
    uint counter;
    uint mask;  // 0: every id allowed; else the row's mask, plus one
};

layout(std430, binding = 0) readonly buffer Lb { float logits[]; };
layout(std430, binding = 0) readonly buffer L4b { vec4 logits4[]; };  // the same rows, for pass 0's arg-max
layout(std430, binding = 1) readonly buffer Pb { RowParams params[]; };
layout(std430, binding = 2) writeonly buffer Ob { int ids[]; };
layout(std430, binding = 3) readonly buffer Mb { uint masks[]; };  // grammar masks (RowParams.mask)

layout(push_constant) uniform Push {
    uint row_stride;
} pc;

shared uint h_cnt[BINS];   // histogram: elements per bin
shared uint h_lo[BINS];    // weight per bin, fixed point, low and high words
shared uint h_hi[BINS];
shared uint h_min[BINS];   // smallest id per bin
shared uint s_cnt[BINS];   // inclusive prefix sums in scan order
shared uint s_lo[BINS];
shared uint s_hi[BINS];
shared uint list_id[CAP];  // the copied elements (before that, the arg-max scratch)
shared float list_y[CAP];
shared uint sh_n;
shared uint sh_bad;        // nonzero: an invocation met a NaN or +inf in pass 0
shared uint sh_sel[6];
shared uint c_cnt[BINS];   // a saved distance histogram
shared uint c_lo[BINS];
shared uint c_hi[BINS];
shared uint c_min[BINS];

// Row state. Every invocation holds the same values (from params, or read from shared memory
// after a barrier), so all control flow outside the per-element loops is uniform.
uint g_base, g_L;
bool g_masked;        // the row has a grammar mask, from word g_mbase of masks
uint g_mbase;
float g_t, g_rcp, g_m, g_p, g_minp;
uint g_u24;           // the draw's 24 random bits
bool g_minp_on;
uint g_ckey, g_cid;   // the cut: key > g_ckey, or key == g_ckey and id <= g_cid
uint g_count;         // elements of the set where known (positive weights only after a weighted select)
bool g_listed;        // the list holds every element the next passes need
bool g_temp_list;     // ... of the current select's bin only: dropped when the select ends
uint g_n;             // entries in the list
bool g_dbin_on;       // the current select is inside distance bin g_dbin
uint g_dbin;
bool g_hist_ready;    // pass 0 built top-k's first histogram
uint g_bkey, g_bid, g_brank;  // a select's result: the boundary element, its rank in the set,
uvec2 g_bbefore;              // and the weight of the set before it
bool g_save_d0, g_d0_saved;   // keep the distance histogram of top-p for the draw
uint r_bin, r_cnt_before, r_cnt_in, r_min, r_tot_cnt;  // a scan's result
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
    if (s >= 96u) {
        inexact = any(notEqual(v, uvec3(0u)));
        return uvec2(0u);
    }
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
// x / t correctly rounded (numpy's fp32 division), with no division per element: Vulkan's x / t
// may be off by 2.5 ulp, and where it is exact it is slow. An ulp of y would move the order (new
// ties) and the weight (by |y| ulp). q = x * (1/t), one Newton step with the residual x - q t
// exact by fma leaves q within an ulp, and of q and its neighbour toward x / t the one with the
// smaller exact residual is the rounded quotient (no quotient of fp32 values is a tie).
float div_rn(float x) {
    if (g_t == 1.0) return x;  // the usual temperature
    precise float q = x * g_rcp;
    if (isinf(x) || isinf(q) || isnan(q) || q == 0.0) return isinf(x) ? x : q;
    precise float r = fma(-q, g_t, x);
    precise float q1 = fma(r, g_rcp, q);
    precise float r1 = fma(-q1, g_t, x);
    if (r1 != 0.0) {
        uint b = floatBitsToUint(q1);
        float qn = uintBitsToFloat((r1 > 0.0) == (q1 > 0.0) ? b + 1u : b - 1u);
        precise float rn = fma(-qn, g_t, x);
        if (abs(rn) < abs(r1)) return qn;
    }
    return q1;
}

// A logit as the rule sees it: -inf where the row's mask has the id's bit off.
float load_x(uint id) {
    if (g_masked && (masks[g_mbase + (id >> 5)] & (1u << (id & 31u))) == 0u) return -1.0 / 0.0;
    return logits[g_base + id];
}

float load_y(uint id) { return div_rn(load_x(id)); }

// Order-preserving bits: a larger float has a larger key; -0 gets +0's key (they tie, as in the
// reference, and then go in id order).
uint key_of(float y) {
    uint u = floatBitsToUint(y);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
float y_of_key(uint k) {
    return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

float weight_of(float y) {
    precise float d = y - g_m;
    return exp_neg(d);
}

// round(w * 2^40) for w in [0, 1], as (low, high) words.
uvec2 fixed40(float w) {
    precise float f = w * 1099511627776.0;                 // 2^40: exact
    precise float hf = floor(f * 2.3283064365386963e-10);   // / 2^32: exact
    precise float rest = f - hf * 4294967296.0;             // exact: f without its top bits
    return uvec2(uint(roundEven(rest)), uint(hf));
}

// Distance bins: 1/8 of a scaled logit below the max; bin 255 from e^-31.9 down (weight 0 here).
// Monotone in y (fp32 subtraction and scaling by 8 are), so each bin is a stretch of the order.
uint dist_bin(float y) {
    precise float d = (g_m - y) * 8.0;
    return d < 255.0 ? uint(d) : 255u;
}

bool in_cut(uint key, uint id) { return key > g_ckey || (key == g_ckey && id <= g_cid); }

// Whether an element belongs to the set (the cut, min-p, the current distance bin), and its
// fixed-point weight when `weighted` or min-p needs it. Weighted passes skip weight-0 elements.
bool in_set(uint id, float y, uint key, bool weighted, out uvec2 w) {
    w = uvec2(0u);
    if (!in_cut(key, id)) return false;
    if (g_dbin_on && dist_bin(y) != g_dbin) return false;
    if (weighted || g_minp_on) {
        float wf = weight_of(y);
        if (g_minp_on && !(wf >= g_minp)) return false;
        w = fixed40(wf);
        if (weighted && (w.x | w.y) == 0u) return false;
    }
    return true;
}

// ---- histograms ------------------------------------------------------------------------------
// 64-bit add into a shared bin with 32-bit atomics: the low word's carry goes to the high word.
// Exact in any order of the additions.
void atomic_add64(uint bin, uvec2 w) {
    if (w.x != 0u) {
        uint old = atomicAdd(h_lo[bin], w.x);
        if (old + w.x < old) w.y += 1u;
    }
    if (w.y != 0u) atomicAdd(h_hi[bin], w.y);
}

// The current histogram's parameters (uniform).
uint hp_kind, hp_shift, hp_prefix, hp_lo, hp_span, hp_tie_key;
bool hp_tie_on, hp_weighted, hp_track_min;

// Each invocation sums its consecutive elements of one bin in registers and adds them to shared
// memory when the bin changes: far fewer atomics where neighbours share a bin (the first id level,
// the first key level).
uint rl_bin, rl_cnt, rl_min;
uvec2 rl_w;

void rl_flush() {
    if (rl_bin != NONE) {
        atomicAdd(h_cnt[rl_bin], rl_cnt);
        if (hp_weighted) atomic_add64(rl_bin, rl_w);
        if (hp_track_min) atomicMin(h_min[rl_bin], rl_min);
    }
    rl_bin = NONE;
}

void rl_add(uint bin, uint id, uvec2 w) {
    if (bin != rl_bin) {
        rl_flush();
        rl_bin = bin;
        rl_cnt = 0u;
        rl_w = uvec2(0u);
        rl_min = NONE;
    }
    rl_cnt += 1u;
    rl_w = add64(rl_w, w);
    rl_min = min(rl_min, id);
}

// Key level: elements whose key, above bit hp_shift + 8, equals hp_prefix; bin = the next 8 bits.
// Id level: ids in [hp_lo, hp_lo + hp_span) (with key == hp_tie_key when hp_tie_on); bin =
// (id - hp_lo) >> hp_shift. Distance level: every element, bin = dist_bin.
void hist_element(uint id, float y) {
    uint key = key_of(y);
    uint bin;
    if (hp_kind == LVL_KEY) {
        if (hp_shift < 24u && (key >> (hp_shift + 8u)) != hp_prefix) return;
        bin = (key >> hp_shift) & 255u;
    } else if (hp_kind == LVL_ID) {
        if (id - hp_lo >= hp_span || (hp_tie_on && key != hp_tie_key)) return;  // id < lo wraps
        bin = (id - hp_lo) >> hp_shift;
    } else {
        bin = dist_bin(y);
    }
    uvec2 w;
    if (!in_set(id, y, key, hp_weighted, w)) return;
    rl_add(bin, id, w);
}

// ---- passes over the row ---------------------------------------------------------------------
// A pass visits the ids of a range, WG apart per invocation (neighbouring invocations read
// neighbouring words). Passes over the row are bound by arithmetic per element (a row has one
// workgroup), so each pass first skips, by comparing x alone, the elements it provably rejects:
// every element a pass can accept has y in a range [ylo, yhi] known in advance (from the cut,
// positive weight, min-p, the bin being resolved), and y = RN(x / t) is monotone in x.
#define SWEEP_HIST 0u
#define SWEEP_GATHER 1u
float sw_xlo, sw_xhi;   // elements with x outside [sw_xlo, sw_xhi] (or NaN) are skipped

float maxb(float a, float b) { return b > a ? b : a; }  // ignores a NaN b
float minb(float a, float b) { return b < a ? b : a; }

// x_lo with: x < x_lo implies RN(x / t) < ylo (a margin of 2^-20 relative, far above the
// roundings of RN and of ylo * t); x_hi likewise.
float x_of_ylo(float ylo) {
    if (isnan(ylo)) return -1.0 / 0.0;
    precise float a = ylo * g_t;
    if (isinf(a)) return a;
    precise float xlo = a - abs(a) * 9.5367431640625e-7 - 1e-30;
    return xlo;
}
float x_of_yhi(float yhi) {
    if (isnan(yhi)) return 1.0 / 0.0;
    precise float a = yhi * g_t;
    if (isinf(a)) return a;
    precise float xhi = a + abs(a) * 9.5367431640625e-7 + 1e-30;
    return xhi;
}

// The y range of keys >= k (lo) or <= k (hi); keys past the infinities are NaN patterns.
float y_lo_of_key(uint k) { return k <= 0x007fffffu ? -1.0 / 0.0 : (k >= 0xff800000u ? 1.0 / 0.0 : y_of_key(k)); }
float y_hi_of_key(uint k) { return k >= 0xff800000u ? 1.0 / 0.0 : (k <= 0x007fffffu ? -1.0 / 0.0 : y_of_key(k)); }

// The slack of a distance-bin edge m - b/8 against the fp32 rounding of (m - y) * 8.
float dist_slack() { return (abs(g_m) + 64.0) * 1e-6; }

// Skip bounds for a pass whose own filter keeps y in [ylo, yhi], combined with the set's.
void set_pass_bounds(float ylo, float yhi, bool weighted) {
    ylo = maxb(ylo, y_lo_of_key(g_ckey));                     // the cut keeps keys >= g_ckey
    if (weighted) ylo = maxb(ylo, g_m - 29.0);                 // below e^-28.42 the weight is 0
    if (g_minp_on) ylo = maxb(ylo, g_m + log(g_minp) - 0.01);  // exp(d) >= min_p
    if (g_dbin_on) {
        ylo = maxb(ylo, g_m - float(g_dbin + 1u) * 0.125 - dist_slack());
        yhi = minb(yhi, g_m - float(g_dbin) * 0.125 + dist_slack());
    }
    sw_xlo = x_of_ylo(ylo);
    sw_xhi = x_of_yhi(yhi);
}

void gather_element(uint id, float y);

void sweep(uint mode, uint begin, uint end) {
    for (uint i = begin + gl_LocalInvocationID.x; i < end; i += WG) {
        float x = load_x(i);
        if (!(x >= sw_xlo && x <= sw_xhi)) continue;
        float y = div_rn(x);
        if (mode == SWEEP_HIST) hist_element(i, y);
        else gather_element(i, y);
    }
}

// A histogram (cleared first) of the set's elements at one level; counts always, weights when
// `weighted`, the smallest id per bin when `track_min`.
void build_hist(uint kind, uint shift, uint prefix, uint lo, uint bits, bool tie_on, uint tie_key,
                bool weighted, bool track_min) {
    uint tid = gl_LocalInvocationID.x;
    hp_kind = kind;
    hp_shift = shift;
    hp_prefix = prefix;
    hp_lo = lo;
    hp_span = 1u << bits;
    hp_tie_on = tie_on;
    hp_tie_key = tie_key;
    hp_weighted = weighted;
    hp_track_min = track_min;
    if (tid < BINS) {
        h_cnt[tid] = 0u;
        h_lo[tid] = 0u;
        h_hi[tid] = 0u;
        h_min[tid] = NONE;
    }
    if (tid == 0u) sh_sel[0] = NONE;
    barrier();
    rl_bin = NONE;
    if (g_listed) {
        for (uint i = tid; i < g_n; i += WG) hist_element(list_id[i], list_y[i]);
    } else {
        uint begin = 0u, end = g_L;
        float ylo = -1.0 / 0.0, yhi = 1.0 / 0.0;
        if (kind == LVL_KEY && shift < 24u) {  // keys with the prefix
            uint klo = prefix << (shift + 8u);
            ylo = y_lo_of_key(klo);
            yhi = y_hi_of_key(klo | ((1u << (shift + 8u)) - 1u));
        }
        if (kind == LVL_ID) {  // only that range of ids
            begin = lo;
            end = min(g_L, lo + hp_span);
            if (tie_on) {
                ylo = y_of_key(tie_key);
                yhi = ylo;
            }
        }
        set_pass_bounds(ylo, yhi, weighted);
        sweep(SWEEP_HIST, begin, end);
    }
    rl_flush();
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

// Scans the histogram in the order's direction (bins descending for keys, ascending for
// distances and ids) and picks the bin where the running total (count, or weight when
// `weighted`) first reaches `rem`: total before it < rem <= total through it. With a level's
// first scan, `kind` first sets `rem` from the set's total. Integer sums: any scan order gives the
// same result (Hillis-Steele, 8 steps).
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

// ---- copies into shared memory ---------------------------------------------------------------
// The current copy's parameters: elements of the set whose distance bin (by_dist) or key lies in
// [gp_lo, gp_hi].
bool gp_by_dist, gp_weighted;
uint gp_lo, gp_hi;

void gather_element(uint id, float y) {
    uint key = key_of(y);
    uint v = gp_by_dist ? dist_bin(y) : key;
    if (v < gp_lo || v > gp_hi) return;
    uvec2 w;
    if (!in_set(id, y, key, gp_weighted, w)) return;
    uint pos = atomicAdd(sh_n, 1u);
    if (pos < CAP) {  // always: the caller counted these elements
        list_id[pos] = id;
        list_y[pos] = y;
    }
}

// One pass over the row copies the elements into the list, in any order (everything computed
// from the list is an integer sum, a count or a minimum). `temp`: the copy is the current select's
// bin only.
void gather(bool by_dist, uint lo, uint hi, bool weighted, bool temp) {
    uint tid = gl_LocalInvocationID.x;
    gp_by_dist = by_dist;
    gp_lo = lo;
    gp_hi = hi;
    gp_weighted = weighted;
    if (tid == 0u) sh_n = 0u;
    barrier();
    float ylo, yhi;
    if (by_dist) {
        ylo = hi >= 255u ? -1.0 / 0.0 : g_m - float(hi + 1u) * 0.125 - dist_slack();
        yhi = g_m - float(lo) * 0.125 + dist_slack();
    } else {
        ylo = y_lo_of_key(lo);
        yhi = y_hi_of_key(hi);
    }
    set_pass_bounds(ylo, yhi, weighted);
    sweep(SWEEP_GATHER, 0u, g_L);
    barrier();
    g_n = min(sh_n, uint(CAP));
    g_listed = true;
    g_temp_list = temp;
    barrier();
}

// The whole set, once it is known to fit.
void maybe_gather(bool weighted) {
    if (!g_listed && g_count <= uint(CAP)) gather(false, 0u, NONE, weighted, false);
}

// ---- selects ---------------------------------------------------------------------------------
// The first element in id order (among the set's elements, with key == tie_key when tie_on)
// whose running total reaches the target. Sets g_bid and g_brank (its rank among those elements).
bool id_select(bool tie_on, uint tie_key, bool weighted, uint kind, uvec2 rem) {
    uint bits = g_L <= 1u ? 1u : uint(findMSB(g_L - 1u)) + 1u;  // ids < 2^bits
    uint lo = 0u, above = 0u;
    uvec2 above_w = uvec2(0u);
    bool first = true;
    for (;;) {
        uint shift = bits > 8u ? bits - 8u : 0u;
        // Over the whole row, bins of 16384 ids (for 2^18 ids: 16 of them) let each invocation
        // add 16 neighbours at once; the range left is small anyway.
        if (first && !g_listed && bits > 8u) shift = min(max(shift, 14u), bits - 1u);
        build_hist(LVL_ID, shift, 0u, lo, bits, tie_on, tie_key, weighted, false);
        scan_choose(false, weighted, first ? kind : TARGET_GIVEN, rem);
        if (r_bin == NONE) return false;
        rem = sub64(rem, weighted ? r_w_before : uvec2(r_cnt_before, 0u));
        above += r_cnt_before;
        above_w = add64(above_w, r_w_before);
        lo += r_bin << shift;
        first = false;
        if (shift == 0u) break;
        bits = shift;
    }
    g_bid = lo;
    g_brank = above + 1u;
    g_bbefore = above_w;
    return true;
}

// The first element of the set in (key descending, id ascending) order whose running total
// reaches the target. Sets g_bkey, g_bid, g_brank.
bool key_select_levels(bool weighted, uint kind, uvec2 rem) {
    uint tid = gl_LocalInvocationID.x;
    uint above = 0u;
    uvec2 above_w = uvec2(0u);
    if (weighted) {  // the distance level
        if (g_d0_saved) {  // the same set's histogram, kept by top-p
            if (tid < BINS) {
                h_cnt[tid] = c_cnt[tid];
                h_lo[tid] = c_lo[tid];
                h_hi[tid] = c_hi[tid];
                h_min[tid] = c_min[tid];
            }
            if (tid == 0u) sh_sel[0] = NONE;
            barrier();
            g_d0_saved = false;
        } else {
            build_hist(LVL_DIST, 0u, 0u, 0u, 0u, false, 0u, true, true);
            if (g_save_d0 && tid < BINS) {  // read before the scan's first barrier
                c_cnt[tid] = h_cnt[tid];
                c_lo[tid] = h_lo[tid];
                c_hi[tid] = h_hi[tid];
                c_min[tid] = h_min[tid];
            }
            g_d0_saved = g_save_d0;
        }
        scan_choose(false, true, kind, rem);
        kind = TARGET_GIVEN;
        if (r_bin == NONE) return false;
        rem = sub64(rem, r_w_before);
        above = r_cnt_before;
        above_w = r_w_before;
        g_count = r_tot_cnt;
        maybe_gather(true);
        if (r_cnt_in == 1u) {
            g_bid = r_min;
            g_bkey = key_of(load_y(r_min));
            g_brank = above + 1u;
            g_bbefore = above_w;
            return true;
        }
        if (!g_listed) {
            if (above + r_cnt_in <= uint(CAP)) gather(true, 0u, r_bin, true, false);  // holds every later set too
            else if (r_cnt_in <= uint(CAP)) gather(true, r_bin, r_bin, true, true);
        }
        g_dbin_on = true;
        g_dbin = r_bin;
    }
    uint prefix = 0u;
    for (uint level = 0u; level < 4u; level++) {
        uint shift = 24u - 8u * level;
        bool track_min = level > 0u || weighted;
        if (!g_hist_ready) build_hist(LVL_KEY, shift, prefix, 0u, 0u, false, 0u, weighted, track_min);
        g_hist_ready = false;
        scan_choose(true, weighted, kind, rem);
        kind = TARGET_GIVEN;
        if (r_bin == NONE) return false;
        rem = sub64(rem, weighted ? r_w_before : uvec2(r_cnt_before, 0u));
        above += r_cnt_before;
        above_w = add64(above_w, r_w_before);
        prefix = (prefix << 8) | r_bin;
        if (level == 0u && !weighted) {
            g_count = r_tot_cnt;
            maybe_gather(false);
        }
        if (track_min && r_cnt_in == 1u) {  // a single element left: it is the boundary
            g_bid = r_min;
            g_bkey = key_of(load_y(r_min));
            g_brank = above + 1u;
            g_bbefore = above_w;
            return true;
        }
        // After the last level but one, the remaining level costs a pass either way.
        if (level < 2u && !g_listed) {
            uint low = prefix << shift;
            if (!g_dbin_on && above + r_cnt_in <= uint(CAP)) gather(false, low, NONE, weighted, false);
            else if (r_cnt_in <= uint(CAP)) gather(false, low, low | ((1u << shift) - 1u), weighted, true);
        }
    }
    // The whole key is known; its elements tie (same y, same weight) and go in id order.
    g_bkey = prefix;
    uvec2 first = weighted ? fixed40(weight_of(y_of_key(prefix))) : uvec2(1u, 0u);
    if (r_cnt_in == 1u || le64(rem, first)) {
        g_bid = r_min;
        g_brank = above + 1u;
        g_bbefore = above_w;
        return true;
    }
    if (!id_select(true, prefix, weighted, TARGET_GIVEN, rem)) return false;
    g_brank += above;
    g_bbefore = add64(g_bbefore, above_w);
    return true;
}

bool key_select(bool weighted, uint kind, uvec2 rem) {
    bool ok = key_select_levels(weighted, kind, rem);
    g_dbin_on = false;
    if (g_temp_list) {
        g_listed = false;
        g_temp_list = false;
    }
    return ok;
}

// An invocation's running arg-max (bv at id bi, NONE before any) after value x at id i, the ids
// coming in ascending order: NaN ignored, the first maximum kept; g_bad set by a NaN or +inf.
bool g_bad;

void keep_max(float x, uint i, inout float bv, inout uint bi) {
    g_bad = g_bad || isnan(x) || (isinf(x) && x > 0.0);
    if (x > bv || (bi == NONE && !isnan(x))) {
        bv = x;
        bi = i;
    }
}

void main() {
    uint r = linear_group();
    if (r >= meta.num_rows) return;
    uint tid = gl_LocalInvocationID.x;
    RowParams prm = params[r];
    g_base = r * pc.row_stride;
    g_L = min(meta.vocab_limit, pc.row_stride);
    g_masked = prm.mask != 0u;
    g_mbase = (prm.mask - 1u) * ((pc.row_stride + 31u) / 32u);
    g_t = prm.temperature;
    g_rcp = 1.0 / g_t;
    bool sampled = g_t > 0.0;
    g_bad = false;
    if (tid == 0u) sh_bad = 0u;
    barrier();

    // Pass 0, the arg-max (lowest id on ties, NaN ignored) of x for greedy rows; of y = x / t for
    // top-k rows, whose first candidate it is, with top-k's first histogram (the keys' top 8
    // bits; no weights needed). Other rows take max x: division by t > 0, correctly rounded, is
    // monotone, so max y = RN(max x / t).
    bool top_k_on = sampled && prm.top_k > 0 && uint(prm.top_k) < g_L;
    bool count_keys = top_k_on && prm.top_k > 1;
    hp_weighted = false;
    hp_track_min = false;
    rl_bin = NONE;
    if (count_keys) {
        if (tid < BINS) {
            h_cnt[tid] = 0u;
            h_lo[tid] = 0u;
            h_hi[tid] = 0u;
            h_min[tid] = NONE;
        }
        if (tid == 0u) sh_sel[0] = NONE;
        barrier();
    }
    float bv = -1.0 / 0.0;
    uint bi = NONE;
    if (!top_k_on) {
        // ARGMAX_LOADS vec4 in flight per invocation where the rows are 16-byte aligned (one float
        // at a time left the pass waiting on its loads: greedy took 31-43 us a 4b step on the H100), then
        // the ids past the last whole vec4. An invocation's ids rise along both loops, so the first
        // maximum is kept.
        // Masked rows take the loop of one id at a time.
        uint n4 = pc.row_stride % 4u == 0u && !g_masked ? g_L / 4u : 0u, b4 = g_base / 4u;
        for (uint v = tid; v < n4; v += WG * ARGMAX_LOADS) {
            vec4 xs[ARGMAX_LOADS];
            [[unroll]] for (uint k = 0u; k < ARGMAX_LOADS; k++) xs[k] = v + k * WG < n4 ? logits4[b4 + v + k * WG] : vec4(0.0);
            [[unroll]] for (uint k = 0u; k < ARGMAX_LOADS; k++) {
                if (v + k * WG >= n4) break;
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    keep_max(xs[k][c], 4u * (v + k * WG) + c, bv, bi);
                }
            }
        }
        for (uint i = 4u * n4 + tid; i < g_L; i += WG) keep_max(load_x(i), i, bv, bi);
    } else {
        for (uint i = tid; i < g_L; i += WG) {
            float y = load_y(i);
            keep_max(y, i, bv, bi);
            if (count_keys && !isnan(y)) rl_add(key_of(y) >> 24, i, uvec2(0u));  // passes skip NaN
        }
        rl_flush();
    }
    list_y[tid] = bv;
    list_id[tid] = bi;
    if (g_bad) atomicOr(sh_bad, 1u);
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
    float vmax = list_y[0];
    bool bad = sh_bad != 0u;
    barrier();  // the scratch becomes the list
    if (bad) {
        if (tid == 0u) ids[r] = NON_FINITE;
        return;
    }
    if (top1 == NONE) top1 = 0u;  // nothing but NaN, or no ids: id 0
    if (!sampled || g_L <= 1u || prm.top_k == 1) {
        if (tid == 0u) ids[r] = int(top1);
        return;
    }
    g_m = top_k_on ? vmax : div_rn(vmax);
    g_ckey = 0u;  // the set: every key, the whole vocabulary
    g_cid = NONE;
    g_minp_on = false;
    g_dbin_on = false;

    g_u24 = philox(uvec4(prm.counter, 0u, 0u, 0u), uvec2(prm.key0, prm.key1)).x >> 8;
    g_p = prm.top_p;
    g_minp = prm.min_p;
    g_listed = false;
    g_temp_list = false;
    g_hist_ready = false;
    g_save_d0 = false;
    g_d0_saved = false;
    g_count = g_L;
    g_bid = top1;
    bool top_p_on = prm.top_p < 1.0;
    bool ok = true;

    if (!(prm.top_k > 0 || top_p_on || prm.min_p > 0.0)) {
        // No filter: the draw runs over the ids in order.
        ok = id_select(false, 0u, true, TARGET_DRAW, uvec2(0u));
    } else {
        if (top_k_on) {
            g_hist_ready = true;
            ok = key_select(false, TARGET_GIVEN, uvec2(uint(prm.top_k), 0u));
            g_ckey = g_bkey;
            g_cid = g_bid;
            g_count = uint(prm.top_k);
        }
        uint draw_kind = TARGET_DRAW;
        uvec2 draw_target_given = uvec2(0u);
        if (ok && top_p_on) {
            maybe_gather(true);
            g_save_d0 = true;
            ok = key_select(true, TARGET_TOPP, uvec2(0u));
            g_save_d0 = false;
            uvec2 through = add64(g_bbefore, fixed40(weight_of(y_of_key(g_bkey))));  // the candidates' total
            if (!(prm.min_p > 0.0) || weight_of(y_of_key(g_bkey)) >= prm.min_p) {
                // min-p keeps the whole prefix (weights fall along the order): the draw's first
                // candidate with cum >= floor(u * total) + 1 lies in it, so the draw runs on
                // top-p's own set, from top-p's distance histogram.
                draw_kind = TARGET_GIVEN;
                draw_target_given = draw_target(through);
            } else {
                g_d0_saved = false;
                g_ckey = g_bkey;
                g_cid = g_bid;
                g_count = g_brank;
            }
            if (g_brank == 1u) g_count = 1u;
        }
        if (ok && g_count > 1u) {  // one candidate left (min-p keeps the first): it is the draw
            if (prm.min_p > 0.0 && draw_kind == TARGET_DRAW) {
                g_minp_on = true;
                g_count = NONE;
            }
            maybe_gather(true);
            ok = key_select(true, draw_kind, draw_target_given);
        }
    }
    if (tid == 0u) ids[r] = int(ok ? g_bid : top1);
}
