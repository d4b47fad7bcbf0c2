"""split.comp, the input stage of the cooperative-matrix matmuls, against numpy on any Vulkan device;
and one whole cooperative matmul (split, matmul_coop, reduce) against float64 where the device
has cooperative matrices.

Row m of x (RMS-normalised with (1 + g) in the NORM variant) must come back as fp16 hi + lo rows
of s * v with s a power of two putting max |s v| in [2^14, 2^15), and scale[m] = 1 / s: then
(hi + lo) * scale reconstructs v to 22 significant bits. Bound: |(hi + lo) / s - v| <= 2^-21
max |v| per row (lo is rounded to fp16, half an ulp of 2^-11 of hi's ulp; a factor 2 of slack
for the fp32 normalisation), which a hi-only split (2^-12) misses by far.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.vulkan.coop_tiles import COOP_FOLD_ROWS
from gemma_batch.backends.vulkan.graph import StepGraph
from gemma_batch.backends.vulkan.variants import GATED_SPLIT_PIECE, ROWS_REDUCE_COLS
from gemma_batch.backends.vulkan.weights import fp16_tiles
from gemma_batch.model.checkpoint import Tensor
from tests.test_cpu_vs_transformers import checkpoints, run_batched  # noqa: F401
from tests.test_vulkan_backend import vulkan_backend
from tests.test_vulkan_coopmat import needs_coopmat
from tests.vulkan_dispatch import Dispatches


def run_split(variant: str, x: np.ndarray, g: np.ndarray, eps: float, w: np.ndarray | None = None,
              chunks: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(hi + lo as fp32 [M, K], scale [M]) from one dispatch of split.comp's `variant`; with
    `w` (bf16 bits [N, K]) also y = x . w^T from the cooperative matmul of fp16 tiles (the decode
    tile of matmul_coop_direct.comp, or matmul_coop.comp's prefill tile) and reduce.comp (rows
    variants)."""
    M, K = x.shape
    with Dispatches(tokens=M) as d:
        split, scale = d.alloc(4 * M * K, "split"), d.alloc(4 * M, "scale")
        d.dispatch(variant, {1: d.upload(x, "x"), 2: split, 3: d.upload(g, "g"), 4: scale}, {"K": K, "eps": eps}, M)
        if w is not None:
            N = w.shape[0]
            part, y = d.alloc(4 * 96 * N * chunks, "partial"), d.alloc(4 * M * N, "y")
            fold = M > 64  # the prefill tile, which sums the chunks itself (coop_tiles.COOP_FOLD_DEFINES)
            d.dispatch("coop_rows_t16_fold" if fold else "coop_rows_t16",
                       {0: d.upload(fp16_tiles(Tensor("BF16", w)), "w"), 1: split, 2: part},
                       {"N": N, "K": K, "kchunk": K // chunks, "group": 0, "fold_rows": COOP_FOLD_ROWS},
                       -(-M // 128) * N // 64 if fold else -(-M // 32) * -(-N // 128) * chunks)
            d.dispatch("reduce_rows", {0: part, 2: y, 4: scale},
                       {"N": N, "chunks": chunks, "fold_rows": COOP_FOLD_ROWS, "eps": eps, "num_heads": 0, "num_kv_heads": 0, "head_dim": 0},
                       M * -(-N // ROWS_REDUCE_COLS))
        d.run()
        halves = d.download(split).view(np.float16).reshape(M, 2, K).astype(np.float32)
        out = d.download(y).view(np.float32).reshape(M, N) if w is not None else None
        return halves[:, 0] + halves[:, 1], d.download(scale).view(np.float32), out


@pytest.mark.parametrize("variant", ["split_plain", "split_norm"])
def test_split_rows_reconstruct_their_input_to_22_bits(variant):
    rng = np.random.default_rng(7)
    M, K, eps = 5, 384, 1e-6
    x = rng.standard_normal((M, K)).astype(np.float32) * np.array([[1e-3], [1.0], [40.0], [3e4], [2e5]], np.float32)
    g = (rng.standard_normal(K) * 0.5).astype(np.float32)
    v = x.astype(np.float64)
    if variant == "split_norm":
        v = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps) * (1.0 + g)
    both, scale, _ = run_split(variant, x, g, eps)
    peak = np.abs(v).max(axis=1)
    assert np.all(np.log2(scale) == np.round(np.log2(scale)))  # powers of two
    assert np.all((peak / scale >= 2.0**14 * (1 - 1e-6)) & (peak / scale < 2.0**15))
    err = np.abs(both * scale[:, None] - v).max(axis=1) / peak
    assert np.all(err <= 2.0**-21), err
    hi_only = np.abs((v / scale[:, None]).astype(np.float16).astype(np.float64) * scale[:, None] - v).max(axis=1) / peak
    assert np.all(hi_only > 8 * 2.0**-21)  # the bound would catch a split that dropped lo


@needs_coopmat
@pytest.mark.parametrize("M", [1, 20, 33, 80])  # 80: the prefill tile
@pytest.mark.parametrize("chunks", [1, 4])
def test_a_cooperative_matmul_matches_float64(M, chunks):
    """Relative error over the output's largest value: about 1e-7 for the split (fp32 sums of
    exact products); 1e-5 bounds it, and plain fp16 inputs (about 1e-4) would fail."""
    rng = np.random.default_rng(M + chunks)
    N, K = 192, 1024  # the decode tile is 128 wide: its second workgroup has half its outputs
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)
    w = (bits.astype(np.uint32) << 16).view(np.float32)
    _, _, y = run_split("split_plain", x, np.zeros(K, np.float32), 1e-6, bits, chunks)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    err = np.abs(y - exact).max() / np.abs(exact).max()
    print(f"M {M} chunks {chunks}: relative error {err:.2e}")
    assert err < 1e-5


@needs_coopmat
@pytest.mark.parametrize("inputs", ["split", "fp16"])
def test_prefill_tiles_sum_as_the_decode_tile_does(inputs):
    """The prefill tiles of fp16 weights (64 wide, and the 128-wide tile of the input mode) give,
    bit for bit, the decode tile's K-chunk sums added in chunk order in fp32 (what reduce.comp
    adds), so a token's output does not depend on the size of its step. 5 row tiles of K = 16,384:
    their x exceeds matmul_coop.comp's FOLD_GROUP_BYTES, so the rows run in groups (2 + 2 + 1 row
    tiles with split inputs, 4 + 1 with fp16)."""
    rng = np.random.default_rng(3)
    M, N, K, chunks = 600, 256, 16384, 4
    bits = ((rng.standard_normal((N, K)) * 0.05).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x = rng.standard_normal((M, K)).astype(np.float32)
    push = {"N": N, "K": K, "kchunk": K // chunks, "group": 0, "fold_rows": COOP_FOLD_ROWS}
    folds = {"coop_t16_fold": 64, "coop_t16_fold_wide_split" if inputs == "split" else "coop_t16_fold_wide": 128}
    with Dispatches(tokens=M, x_lo=inputs == "split") as d:
        split, scale, tiles = d.alloc(4 * M * K, "split"), d.alloc(4 * M, "scale"), d.upload(fp16_tiles(Tensor("BF16", bits)), "w")
        d.dispatch("split_plain", {1: d.upload(x, "x"), 2: split, 4: scale}, {"K": K, "eps": 1e-6}, M)
        mpad = -(-M // 32) * 32
        part = d.alloc(4 * chunks * mpad * N, "chunk sums")
        d.dispatch("coop_t16", {0: tiles, 1: split, 2: part}, push, mpad // 32 * N // 128 * chunks)
        outs = {name: d.alloc(4 * -(-M // 128) * 128 * N, name) for name in folds}
        for name, cols in folds.items():
            d.dispatch(name, {0: tiles, 1: split, 2: outs[name]}, push, -(-M // 128) * N // cols)
        d.run()
        sums = d.download(part).view(np.float32).reshape(chunks, mpad, N)[:, :M]
        expected = sums[0]
        for c in range(1, chunks):
            expected = expected + sums[c]  # float32, in chunk order
        for name in folds:
            assert np.array_equal(d.download(outs[name]).view(np.float32)[: M * N].reshape(M, N), expected), name


@needs_coopmat
def test_the_decode_tile_loops_over_its_tiles_with_fewer_workgroups():
    """matmul_coop_direct.comp given fewer workgroups than (chunk, row tile, column tile)s loops
    over them (the LM head's capped grid, grids.py): the same sums, bit for bit, as a workgroup a
    tile; 2 x 5 x 2 = 20 tiles over 3 workgroups, the last column tile half past N."""
    rng = np.random.default_rng(5)
    M, N, K, chunks = 40, 576, 1024, 2
    bits = ((rng.standard_normal((N, K)) * 0.05).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    push = {"N": N, "K": K, "kchunk": K // chunks, "group": 0, "fold_rows": COOP_FOLD_ROWS}
    tiles = -(-M // 32) * -(-N // 128) * chunks
    with Dispatches(tokens=M) as d:
        split, scale, w = d.alloc(4 * M * K, "split"), d.alloc(4 * M, "scale"), d.upload(fp16_tiles(Tensor("BF16", bits)), "w")
        d.dispatch("split_plain", {1: d.upload(rng.standard_normal((M, K)).astype(np.float32), "x"), 2: split, 4: scale},
                   {"K": K, "eps": 1e-6}, M)
        outs = [d.alloc(4 * chunks * 64 * N, f"partial {groups}") for groups in (tiles, 3)]
        for out, groups in zip(outs, (tiles, 3)):
            d.dispatch("coop_rows_t16", {0: w, 1: split, 2: out}, push, groups)
        d.run()
        full, looped = (d.download(out).view(np.float32).reshape(chunks, 64, N)[:, :M] for out in outs)
        assert np.isfinite(full).all() and np.array_equal(full, looped)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def run_fused_reduce(variant: str, part: np.ndarray, scale: np.ndarray, N: int, eps: float,
                     buffers: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """One dispatch of reduce.comp's SPLIT_NEXT `variant` (a workgroup per row, or per
    GATED_SPLIT_PIECE columns of a row for reduce_gated_split) over partial sums `part` [chunks,
    Mpad, width] and the input scales, with kernels built for a hidden size of N; returns the
    split (hi + lo as fp32 [M, N]), the new scales, the buffers at bindings 10 (x_res) and 6
    (row_sync, zeroed before) after the dispatch."""
    chunks, M = part.shape[0], len(scale)
    with Dispatches(tokens=M, hidden=N) as d:
        arrays = {0: part, 4: scale, 6: np.zeros(2 * M, np.uint32), **buffers}
        bufs = {b: d.upload(a, f"binding {b}") for b, a in arrays.items()}
        bufs.update({2: d.alloc(4 * M * N, "y"), 5: d.alloc(4 * M * N, "split")})
        d.dispatch(variant, bufs, {"N": N, "chunks": chunks, "fold_rows": COOP_FOLD_ROWS, "eps": eps, "num_heads": 0, "num_kv_heads": 0, "head_dim": 0},
                   M * (-(-N // GATED_SPLIT_PIECE) if variant == "reduce_gated_split" else 1))
        d.run()
        halves = d.download(bufs[5]).view(np.float16).reshape(M, 2, N).astype(np.float32)
        out = {"split": halves[:, 0] + halves[:, 1], "scale": d.download(bufs[4]).view(np.float32),
               "row_sync": d.download(bufs[6]).view(np.uint32)}
        if 10 in buffers:
            out["x_res"] = d.download(bufs[10]).view(np.float32).reshape(M, N)
        return out


@pytest.mark.parametrize("variant,M,chunks", [("reduce_post_norm_split", 5, 3), ("reduce_post_norm_split", 5, 1),
                                              ("reduce_gated_split", 5, 3), ("reduce_gated_split_rows", 20, 3),
                                              ("reduce_gated_split_rows", 20, 1)])
def test_reduces_that_write_the_next_split_match_float64(variant, M, chunks):
    """The fused reduces (graph.py: o, gate/up and down write the next matmul's split; gate/up's
    in 3 pieces a row, the last to finish splitting it, or a workgroup per row, whose loads go out
    a round at a time with up to 2 chunks (2: bit for bit as the pieces, the test below); the
    post-norm a workgroup per row of 4,160 values, 2 vec4 an invocation, or with one chunk of 640,
    1) against float64 of the same fp32 inputs: the new residual to 1e-6 of its row's largest
    value (fp32 sums), and the split to 2^-20 of the row's largest value (split.comp's 2^-21,
    doubled for the fp32 arithmetic before it)."""
    rng = np.random.default_rng(3)
    gated = variant.startswith("reduce_gated")
    N, eps = 2 * GATED_SPLIT_PIECE + 64 if gated or chunks > 1 else 640, 1e-6  # gated: 3 pieces a row
    width = 2 * N if gated else N
    part = rng.standard_normal((chunks, 32, width)).astype(np.float32) * 50
    scale = np.float32(2.0) ** rng.integers(-12, -2, M).astype(np.float32)
    total = part[:, :M].astype(np.float64).sum(axis=0) * scale[:, None]
    buffers = {}
    if gated:
        v = gelu_tanh(total[:, :N]) * total[:, N:]
    else:
        x_res = (rng.standard_normal((M, N)) * np.array([[1e-2], [1], [30], [1e3], [5e4]])).astype(np.float32)
        g_epi, g_next = (rng.standard_normal((2, N)) * 0.5).astype(np.float32)
        buffers = {3: g_next, 9: g_epi, 10: x_res}
        rms = lambda a: np.sqrt((a * a).mean(axis=1, keepdims=True) + eps)  # noqa: E731
        new_res = x_res + total / rms(total) * (1.0 + g_epi)
        v = new_res / rms(new_res) * (1.0 + g_next)
    out = run_fused_reduce(variant, part, scale, N, eps, buffers)
    peak = np.abs(v).max(axis=1)
    s = out["scale"]
    assert np.all(np.log2(s) == np.round(np.log2(s))) and np.all((peak / s >= 2.0**14 * (1 - 1e-6)) & (peak / s < 2.0**15))
    err = np.abs(out["split"] * s[:, None] - v).max(axis=1) / peak
    assert np.all(err <= 2.0**-20), err
    assert not out["row_sync"].any()  # the last piece of each row reset them for the next layer (or never used)
    if not gated:
        res_err = np.abs(out["x_res"] - new_res).max(axis=1) / np.abs(new_res).max(axis=1)
        assert np.all(res_err <= 1e-6), res_err


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_gated_split_in_pieces_and_by_whole_rows_agree_bit_for_bit(chunks):
    """Batch invariance of gate/up's reduce: a row's act and split are the same bits whether its
    step's recording runs it in pieces (reduce_gated_split, act4_of) or a workgroup per row
    (reduce_gated_split_rows, act_row). The first 5 rows of a 20-row step against the same rows
    as a 5-row step."""
    rng = np.random.default_rng(4)
    N = 2 * GATED_SPLIT_PIECE + 64
    part = rng.standard_normal((chunks, 32, 2 * N)).astype(np.float32) * 50
    scale = np.float32(2.0) ** rng.integers(-12, -2, 20).astype(np.float32)
    whole = run_fused_reduce("reduce_gated_split_rows", part, scale, N, 1e-6, {})
    pieces = run_fused_reduce("reduce_gated_split", part, scale[:5], N, 1e-6, {})
    assert np.array_equal(whole["split"][:5].view(np.uint32), pieces["split"].view(np.uint32))
    assert np.array_equal(whole["scale"][:5].view(np.uint32), pieces["scale"].view(np.uint32))


def split_words_reference(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """split.glsl in numpy, from its definition: per row s = 2^(15 - e) with max |v| < 2^e
    (frexp), hi = fp16(s v) (nearest, ties to even), lo = fp16(s v - hi); (hi row | lo row) as
    fp16 [M, 2 K], and 1 / s [M]."""
    _, e = np.frexp(np.abs(v).max(axis=1))
    s = np.float32(2.0) ** np.clip(15 - e, -100, 100).astype(np.float32)
    scaled = v * s[:, None]
    hi = scaled.astype(np.float16)
    lo = (scaled - hi.astype(np.float32)).astype(np.float16)
    return np.concatenate([hi, lo], axis=1), (1 / s).astype(np.float32)


def test_attention_writes_the_o_projections_split_as_split_comp_would(checkpoints, monkeypatch):
    """attention.comp SPLIT_OUT (on the cooperative path the o projection's input, written by the
    last of a token's kv heads to finish): bit for bit the split of attention's own output, after
    every step of a batched run (prefill in 7-token chunks mixed with decode, chunks of 4 keys so
    that tokens merge several chunks; llvmpipe runs the portable path, so the test turns the
    variant on itself and gives it buffers)."""
    backend = vulkan_backend(checkpoints["causal"][0], attention_chunk=4)
    cfg, most_tokens = backend.cfg, 64
    split = backend.mem.alloc(4 * most_tokens * cfg.q_width, "test split")
    scale = backend.mem.alloc(4 * most_tokens, "test split scale")
    record = StepGraph._dispatch

    def dispatch(self, name, buffers, push, grid, specialize=False):
        if name.startswith("attention_"):
            name, buffers = f"{name}_split", {**buffers, 11: split, 12: scale}
        record(self, name, buffers, push, grid, specialize)

    monkeypatch.setattr(StepGraph, "_dispatch", dispatch)
    checked = []

    def after_step(batch):
        T = len(batch.positions)
        assert T <= most_tokens
        attn = backend.mem.download(backend.buffers.attn).view(np.float32)[:T * cfg.q_width].reshape(T, cfg.q_width)
        words, inv_scale = split_words_reference(attn)
        got = backend.mem.download(split).view(np.float16)[:T * 2 * cfg.q_width].reshape(T, 2 * cfg.q_width)
        np.testing.assert_array_equal(got.view(np.uint16), words.view(np.uint16))
        np.testing.assert_array_equal(backend.mem.download(scale).view(np.float32)[:T], inv_scale)
        checked.append(T)

    run_batched(backend, step_token_budget=7, after_step=after_step)
    assert len(checked) > 4 and max(checked) > 1
