"""The on-device sampler (shaders/sample.comp) against the numpy reference (backends/sampler.py).

The shader keeps the reference's arithmetic wherever it decides something discrete: the same fp32
y = logits / temperature (correctly rounded) and fp32 y - max y, the same order and tie-breaks,
the same Philox bits, and exact integer running totals and targets. What differs is each weight
exp(y - max y): float64 in the reference; in the shader an fp32 exp (at most 1.02e-7 relative
error: measured over 3M arguments in [-87, 0] by emulating it in numpy) stored as round(w * 2^40)
(weights below 2^-41 become 0). So every cumulative weight and total the shader uses is within
REL * itself + ABS of the reference's:

    REL = 3e-7: the exp's 1.02e-7, twice (the boundary's cumulative weight, and the total that
                scales u or p), with room to spare;
    ABS = 2 n 2^-40 for n candidates: the fixed-point rounding (at most 2^-41 per weight), twice.

A decision can only differ where the reference's own target lies that close to a boundary. So
each row is also drawn with the reference at u, top_p and min_p moved by that margin (u -> u (1
+- REL) +- ABS / T, top_p likewise, min_p -> min_p (1 +- REL)): where all 27 variants give one
token ("stable" rows) the shader must give exactly it; elsewhere ("boundary" rows) it must give
one of the variants' tokens, and such rows must be rare.

One deliberate difference from `sample_tokens`: with ties at the top-k cut, the reference's
`np.argpartition` keeps an arbitrary subset of the tied ids (numpy's introselect), while its
docstring, and the shader, keep the lowest ids. Rows whose k-th and (k+1)-th scaled logits tie are
compared against that documented rule (`spec_candidates`); all other rows against `sample_tokens`
itself, and `spec_candidates` is checked to agree with it on those rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import pytest

from gemma_batch.backends.base import NON_FINITE, SamplingBatch
from gemma_batch.backends.sampler import allowed_only, candidates, draw, philox4x32, sample_tokens, uniform
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import META_BINDING, Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.step_buffers import PARAMS_DTYPE

REL = 3e-7
FIX = 2.0**-40


class SamplerHarness:
    """The "sample" kernel alone: logits, parameters and the step header in, ids out."""

    def __init__(self) -> None:
        self.dev = Device()
        self.mem = Memory(self.dev)
        self.kernels = Kernels(self.dev)

    def run(self, logits: np.ndarray, params: np.ndarray, vocab_limit: int,
            masks: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """ids [R] for logits [R, V] and a PARAMS_DTYPE array [R] (its `mask` naming a row of
        `masks` [M, ceil(V / 32)] int32, plus one); and the seconds the dispatch took."""
        R, V = logits.shape
        mem, vk = self.mem, self.dev.vk
        masks = np.full((1, -(-V // 32)), -1, np.int32) if masks is None else masks
        mb = mem.alloc_host(masks.nbytes, "masks")
        mb.array[: masks.nbytes].view(np.int32)[:] = masks.ravel()
        meta = mem.alloc_host(16, "meta")
        meta.array[:16].view(np.uint32)[:] = (0, 0, R, vocab_limit)
        lb = mem.alloc(4 * R * V, "logits")
        mem.upload(lb, np.ascontiguousarray(logits, np.float32))
        pb = mem.alloc_host(PARAMS_DTYPE.itemsize * R, "params")
        pb.array[: PARAMS_DTYPE.itemsize * R].view(PARAMS_DTYPE)[:] = params
        ib = mem.alloc_host(4 * R, "ids")
        ib.array[: 4 * R].view(np.int32)[:] = -7
        gb = mem.alloc_host(12, "grid")
        gb.array[:12].view(np.uint32)[:] = (R, 1, 1)
        dset = self.kernels.descriptor_set({META_BINDING: meta, 0: lb, 1: pb, 2: ib, 3: mb}, meta)
        cb = self.dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        self.kernels.record(cb, "sample", dset, {"row_stride": V}, gb, 0)
        vk.vkEndCommandBuffer(cb)
        start = time.perf_counter()
        self.dev.submit_and_wait(cb)
        seconds = time.perf_counter() - start
        out = ib.array[: 4 * R].view(np.int32).copy()
        vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [cb])
        for buf in (meta, lb, pb, ib, gb, mb):
            mem.free(buf)
        return out, seconds


@pytest.fixture(scope="module")
def sampler():
    try:
        return SamplerHarness()
    except Exception as e:  # no Vulkan driver here
        pytest.skip(f"no Vulkan device: {e}")


def make_params(rng, R, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    p = np.zeros(R, PARAMS_DTYPE)
    p["temperature"], p["top_k"], p["top_p"], p["min_p"] = temperature, top_k, top_p, min_p
    p["key0"] = rng.integers(0, 2**32, R, dtype=np.uint64)
    p["key1"] = rng.integers(0, 2**32, R, dtype=np.uint64)
    p["counter"] = rng.integers(0, 2**32, R, dtype=np.uint64)
    return p


def random_params(rng, R) -> np.ndarray:
    """Every combination of filters, temperature 0 rows among them."""
    p = make_params(rng, R)
    p["temperature"] = rng.choice(np.float32([0.0, 0.05, 0.3, 0.7, 1.0, 1.0, 1.7, 5.0]), R)
    p["top_k"] = rng.choice([0, 0, 1, 2, 7, 40, 300, 5000, 10**9], R)
    p["top_p"] = rng.choice(np.float32([1.0, 1.0, 0.1, 0.5, 0.9, 0.95, 0.999]), R)
    p["min_p"] = rng.choice(np.float32([0.0, 0.0, 1e-4, 0.02, 0.1, 0.5, 1.0]), R)
    return p


def sampling_batch(params: np.ndarray, vocab_size: int) -> SamplingBatch:
    return SamplingBatch(
        params["temperature"].copy(), params["top_k"].copy(), params["top_p"].copy(), params["min_p"].copy(),
        np.stack([params["key0"], params["key1"]], axis=1).astype(np.uint32), params["counter"].astype(np.uint32),
        vocab_size=vocab_size,
    )


def topk_tie_at_cut(x: np.ndarray, temperature: float, top_k: int) -> bool:
    """Whether the k-th and (k+1)-th largest x / temperature tie (argpartition then picks freely)."""
    if not 0 < top_k < len(x):
        return False
    y = x / np.float32(temperature)
    part = -np.partition(-y, [top_k - 1, top_k])
    return bool(part[top_k - 1] == part[top_k])


def spec_candidates(x, temperature, top_k, top_p, min_p):
    """`candidates` with top-k keeping the lowest ids on a tie at the cut, as its docstring says."""
    if not 0 < top_k < len(x):
        return candidates(x, temperature, top_k, top_p, min_p)
    y = x / np.float32(temperature)
    kth = -np.partition(-y, top_k - 1)[top_k - 1]
    above = np.flatnonzero(y > kth)
    tied = np.flatnonzero(y == kth)[: top_k - len(above)]
    keep = np.sort(np.concatenate([above, tied]))
    # Only the k kept logits, in id order: top_k = k is then "on" (sorted order) but cuts nothing.
    ids, weights = candidates(x[keep], temperature, len(keep), top_p, min_p)
    return keep[ids], weights


def reference_tokens(x: np.ndarray, prm, u: float) -> tuple[int, set[int]]:
    """The rule's token for one row (logits already cut to the vocabulary), and the tokens of the
    27 variants with u, top_p, min_p moved by the shader's error margin (see the module docstring)."""
    t, k, p, mp = float(prm["temperature"]), int(prm["top_k"]), float(prm["top_p"]), float(prm["min_p"])
    if t <= 0:
        token = int(np.argmax(x))
        return token, {token}
    ids, w = spec_candidates(x, t, k, p, mp)
    token = draw(ids, w, u)
    slack = 2 * len(x) * FIX / w.sum()
    ps = [p] if p >= 1 else sorted({p, min(p * (1 + REL) + slack, np.nextafter(1, 0)), max(p * (1 - REL) - slack, 0)})
    mps = [mp] if mp <= 0 else sorted({mp, min(mp * (1 + REL), 1.0), mp * (1 - REL)})  # min_p > 1 keeps nothing
    tokens = set()
    for p2, mp2 in itertools.product(ps, mps):
        ids2, w2 = (ids, w) if (p2, mp2) == (p, mp) else spec_candidates(x, t, k, p2, mp2)
        slack2 = 2 * len(x) * FIX / w2.sum()
        for u2 in (u, u * (1 + REL) + slack2, max(u * (1 - REL) - slack2, 0.0)):
            tokens.add(draw(ids2, w2, min(u2, np.nextafter(1, 0))))
    return token, tokens


def compare(sampler, logits: np.ndarray, params: np.ndarray, vocab_limit: int, masks: np.ndarray | None = None) -> dict:
    """Runs the shader and checks each row against the reference (a row with a mask: on its logits
    with -inf where the mask has the id off, `sampler.allowed_only`); returns the statistics."""
    got, seconds = sampler.run(logits, params, vocab_limit, masks)
    if masks is not None:
        logits = np.stack([allowed_only(x, masks[m - 1]) if m else x for x, m in zip(logits, params["mask"])])
    x = logits[:, :vocab_limit]
    theirs = sample_tokens(logits, sampling_batch(params, vocab_limit), np.arange(len(logits)))
    u = uniform(np.stack([params["key0"], params["key1"]], axis=1).astype(np.uint32), params["counter"].astype(np.uint32))
    stats = dict(rows=len(x), boundary=0, differ=0, ties_at_topk=0, argpartition_picks_other_ids=0, seconds=seconds)
    for i in range(len(x)):
        token, variants = reference_tokens(x[i], params[i], float(u[i]))
        tie = params["temperature"][i] > 0 and topk_tie_at_cut(x[i], float(params["temperature"][i]), int(params["top_k"][i]))
        stats["ties_at_topk"] += tie
        stats["argpartition_picks_other_ids"] += int(tie and token != theirs[i])
        if not tie:
            assert token == theirs[i], f"row {i}: this file's rule {token} != sample_tokens {theirs[i]}"
        row = f"row {i} {params[i]}: shader {got[i]}, reference {token}, variants {sorted(variants)}"
        assert 0 <= got[i] < vocab_limit, row
        if len(variants) == 1:
            assert got[i] == token, row
        else:
            stats["boundary"] += 1
            assert got[i] in variants, row
        stats["differ"] += int(got[i] != token)
    return stats


def llm_like(rng, R, V) -> np.ndarray:
    """Peaked rows: a few strong candidates over a broad tail."""
    x = rng.standard_normal((R, V)).astype(np.float32) * 2.5
    for i in range(R):
        top = rng.choice(V, 20, replace=False)
        x[i, top] += rng.uniform(5, 15, 20).astype(np.float32)
    return x


def tied(rng, R, V) -> np.ndarray:
    """Few distinct values (heavy ties everywhere, at every cut), plus -inf and -1e30 entries."""
    x = rng.integers(-6, 3, (R, V)).astype(np.float32) * np.float32(0.75)
    x[rng.random((R, V)) < 0.2] = -np.inf
    x[rng.random((R, V)) < 0.1] = np.float32(-1e30)
    x[rng.random((R, V)) < 0.05] = -0.0
    return x


def test_agreement_with_the_reference_over_many_rows(sampler):
    """~530 rows: vocab sizes 97 to 262,208 (a vocabulary limit below it), every filter combination,
    temperature 0 rows mixed in, normal, peaked and heavily tied logits with -inf / -1e30 entries."""
    rng = np.random.default_rng(1234)
    cases = [
        ("normal", 32, 262144, 262144, lambda R, V: (rng.standard_normal((R, V)) * 3).astype(np.float32)),
        ("llm", 32, 262144, 262144, lambda R, V: llm_like(rng, R, V)),
        ("flat", 32, 262144, 262144, lambda R, V: rng.standard_normal((R, V)).astype(np.float32)),
        ("tied", 32, 262144, 262144, lambda R, V: tied(rng, R, V)),
        ("padded", 16, 262208, 262144, lambda R, V: llm_like(rng, R, V)),
        ("normal", 64, 65536, 65536, lambda R, V: (rng.standard_normal((R, V)) * 1.5).astype(np.float32)),
        ("tied", 64, 4099, 4099, lambda R, V: tied(rng, R, V)),
        ("llm", 64, 5000, 4099, lambda R, V: llm_like(rng, R, V)),
        ("normal", 64, 97, 97, lambda R, V: (rng.standard_normal((R, V)) * 2).astype(np.float32)),
        ("shifted", 32, 65536, 65536, lambda R, V: llm_like(rng, R, V) + np.float32(-60)),
        ("shifted", 32, 65536, 65000, lambda R, V: (rng.standard_normal((R, V)) + 200).astype(np.float32)),
        ("tied", 64, 97, 90, lambda R, V: tied(rng, R, V)),
    ]
    total = dict(rows=0, boundary=0, differ=0, ties_at_topk=0, argpartition_picks_other_ids=0, seconds=0.0)
    for name, R, V, limit, make in cases:
        logits = make(R, V)
        if limit < V:  # the padding rows would win everything
            logits[:, limit:] = 50.0
        stats = compare(sampler, logits, random_params(rng, R), limit)
        print(f"{name:7s} R={R:3d} V={V:6d}: {stats}")
        for key in total:
            total[key] += stats[key]
    print("total", total)
    assert total["ties_at_topk"] >= 20  # the tie-breaking paths ran
    assert total["boundary"] <= 0.03 * total["rows"]
    assert total["differ"] <= 0.01 * total["rows"]


def test_each_filter_alone_on_full_vocabulary_rows(sampler):
    """Every row of a batch with the same filter, so each path (id-order draw, top-k, top-p, min-p,
    gathered and not) runs on 262,144 ids."""
    rng = np.random.default_rng(7)
    x = llm_like(rng, 16, 262144)
    for filters in [dict(), dict(top_k=50), dict(top_k=3000), dict(top_p=0.9), dict(top_p=0.999), dict(min_p=0.05),
                    dict(min_p=1e-3), dict(top_k=40, top_p=0.95, min_p=0.1)]:
        stats = compare(sampler, x, make_params(rng, 16, temperature=0.8, **filters), 262144)
        print(filters, stats)
        assert stats["differ"] <= 1


def test_draws_are_the_philox_bits(sampler):
    """2^16 equal logits: the draw is floor(u * 2^16), the top 16 of the 24 bits of u, exactly, in
    id order (no filter) and in the sorted order (every id ties); 96 keys and counters, edge ones."""
    rng = np.random.default_rng(3)
    R, V = 96, 1 << 16
    p = make_params(rng, R)
    p["key0"][:4] = [0, 0xFFFFFFFF, 0, 0xFFFFFFFF]
    p["key1"][:4] = [0, 0xFFFFFFFF, 0xFFFFFFFF, 0]
    p["counter"][:4] = [0, 0xFFFFFFFF, 1, 0x80000000]
    p["min_p"][R // 2:] = 0.5  # sorted order; every weight is 1
    counters = np.zeros((R, 4), np.uint32)
    counters[:, 0] = p["counter"]
    words = philox4x32(counters, np.stack([p["key0"], p["key1"]], axis=1).astype(np.uint32))[:, 0]
    got, _ = sampler.run(np.zeros((R, V), np.float32), p, V)
    assert got.tolist() == (words >> 16).astype(np.int32).tolist()


def test_ids_at_or_past_the_vocabulary_limit_are_never_drawn(sampler):
    rng = np.random.default_rng(5)
    R, V, limit = 64, 300, 200
    x = rng.standard_normal((R, V)).astype(np.float32)
    x[:, limit:] = 1e4  # dominate every rule if they were allowed
    p = random_params(rng, R)
    got, _ = sampler.run(x, p, limit)
    assert got.min() >= 0 and got.max() < limit
    assert got.tolist() == sample_tokens(x, sampling_batch(p, limit), np.arange(R)).tolist()
    # Everything below the limit is -inf and past it finite: still an id below the limit.
    x[:, :limit] = -np.inf
    got, _ = sampler.run(x, p, limit)
    assert got.min() >= 0 and got.max() < limit


def test_temperature_zero_is_the_arg_max_with_the_lowest_id_on_ties(sampler):
    rng = np.random.default_rng(11)
    V = 5000
    rows = []
    for pos in ([0], [V - 1], [17, 18, 4000], [4999, 3]):
        r = rng.standard_normal(V).astype(np.float32)
        r[pos] = 9.0
        rows.append(r)
    rows.append(np.zeros(V, np.float32))  # all tie: id 0
    rows.append(np.full(V, -np.inf, np.float32))  # nothing finite: id 0, like np.argmax
    r = np.full(V, -1.0, np.float32)
    r[[40, 30]] = [0.0, -0.0]  # -0 ties with +0: id 30
    rows.append(r)
    x = np.stack(rows)
    p = make_params(rng, len(x), temperature=0.0, top_k=5, top_p=0.5, min_p=0.1)  # filters ignored
    got, _ = sampler.run(x, p, V)
    assert got.tolist() == [0, V - 1, 17, 3, 0, 0, 30]
    assert got.tolist() == np.argmax(x, axis=1).tolist()


def test_rows_with_nan_or_plus_infinity_get_the_non_finite_id(sampler):
    """A NaN or +inf the row's mask lets through (below the vocabulary limit) gives NON_FINITE on
    every path, as the reference does; -inf, a NaN past the limit or behind the mask, do not."""
    rng = np.random.default_rng(13)
    R, V, limit = 12, 5000, 4990
    x = rng.standard_normal((R, V)).astype(np.float32)
    x[0, 3] = x[1, 4999 - 20] = x[6, 100] = x[7, 2000] = np.nan
    x[2, 0] = x[8, 1234] = np.inf
    x[3, :100] = -np.inf
    x[4, 4995] = np.nan  # past the limit
    x[5, 7] = np.nan  # behind row 5's mask
    allowed = np.ones((R, -(-V // 32) * 32), bool)
    allowed[5, 7] = False
    masks = np.packbits(allowed, axis=1, bitorder="little").view("<i4").astype(np.int32)
    p = make_params(rng, R, temperature=0.0)
    p["temperature"][6:] = 0.9
    p["top_k"][[7, 9]] = 40
    p["top_p"][[8, 10]] = 0.9
    p["mask"] = np.arange(1, R + 1) * (np.arange(R) % 2 == 1)  # odd rows masked (all but row 5's id 7 allowed)
    got, _ = sampler.run(x, p, limit, masks)
    bad = [0, 1, 2, 6, 7, 8]
    assert list(np.flatnonzero(got == NON_FINITE)) == bad
    row_masks = np.where((p["mask"] > 0)[:, None], masks[np.maximum(p["mask"].astype(np.int64) - 1, 0)], -1)
    cpu = sample_tokens(x, dataclasses.replace(sampling_batch(p, limit), allowed=row_masks), np.arange(R))
    assert list(np.flatnonzero(cpu == NON_FINITE)) == bad
    assert (got[[3, 4, 5]] == cpu[[3, 4, 5]]).all()


def test_top_k_1_is_greedy(sampler):
    rng = np.random.default_rng(12)
    R, V = 32, 262144
    x = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    x[::2, 1000:1010] = x[::2].max(axis=1, keepdims=True) + 1  # ties at the top: the lowest id
    p = random_params(rng, R)
    p["top_k"] = 1
    p["temperature"] = np.where(p["temperature"] > 0, p["temperature"], 1.0)
    got, _ = sampler.run(x, p, V)
    assert got.tolist() == np.argmax(x, axis=1).tolist()


def random_masks(rng, M: int, V: int, limit: int) -> np.ndarray:
    """M grammar masks [M, ceil(V / 32)] int32 over ids below `limit`: a few ids allowed, many, all
    but a few, one, or runs of whole words (ids past the limit off, as `Matcher.fill_mask` leaves them)."""
    allowed = np.zeros((M, -(-V // 32) * 32), bool)
    V = limit
    for m in range(M):
        kind = m % 5
        if kind == 0:
            allowed[m, rng.choice(V, int(rng.integers(2, 40)), replace=False)] = True
        elif kind == 1:
            allowed[m, :V] = rng.random(V) < 0.3
        elif kind == 2:
            allowed[m, :V] = True
            allowed[m, rng.choice(V, 50, replace=False)] = False
        elif kind == 3:
            allowed[m, int(rng.integers(V))] = True
        else:
            start = int(rng.integers(V // 32)) * 32
            allowed[m, start: min(V, start + 32 * int(rng.integers(1, 8)))] = True
    return np.packbits(allowed, axis=1, bitorder="little").view("<i4").astype(np.int32)


def test_grammar_masks_on_every_path(sampler):
    """Rows with a mask (RowParams.mask) draw as the reference does on their logits with -inf where
    the mask has an id off: every filter combination, greedy rows, masks of one id to all but 50,
    rows without a mask among them; a drawn id is always one the mask allows."""
    rng = np.random.default_rng(17)
    for R, V, limit in [(48, 262144, 262144), (64, 5000, 4099), (64, 97, 97)]:
        x = llm_like(rng, R, V)
        x[:, limit:] = 50.0
        masks = random_masks(rng, R, V, limit)
        p = random_params(rng, R)
        p["mask"] = np.where(rng.random(R) < 0.8, np.arange(1, R + 1), 0)
        stats = compare(sampler, x, p, limit, masks)
        print(f"R={R} V={V}: {stats}")
        assert stats["differ"] <= 0.02 * R
        got, _ = sampler.run(x, p, limit, masks)
        bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")
        masked = p["mask"] > 0
        assert bits[p["mask"][masked] - 1, got[masked]].all()


def test_rows_do_not_depend_on_the_batch(sampler):
    """A row's draw depends on its logits, parameters, key and counter only."""
    rng = np.random.default_rng(13)
    R, V = 24, 65536
    x = llm_like(rng, R, V)
    p = random_params(rng, R)
    got, _ = sampler.run(x, p, V)
    perm = rng.permutation(R)
    again, _ = sampler.run(x[perm], p[perm], V)
    assert again.tolist() == got[perm].tolist()
    alone, _ = sampler.run(x[5:6], p[5:6], V)
    assert alone[0] == got[5]
