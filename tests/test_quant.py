"""Weight formats (int8, int4, int5, fp16), their on-disk cache, and the KV cache formats.

References are independent of the code under test: element-by-element loops for the int4 and
min8 packings, torch for bf16 rounding, the `safetensors` library for the files we write.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import safetensors.numpy
import torch

from gemma_batch.backends.cpu_math import matmul_rows
from gemma_batch.backends.kv_formats import KVStore, bf16_round
from gemma_batch.model import quant_cache
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat, quantize
from gemma_batch.model.conversion import converted_nbytes_by_dtype
from gemma_batch.model.quant_cache import load_converted
from gemma_batch.model.safetensors_file import SafetensorsWriter
from tests.tiny_models import make_causal_lm

rng = np.random.default_rng(0)


def matrix(n: int = 24, k: int = 128) -> np.ndarray:
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[3] = 0.0  # an all-zero channel / group
    w[5, 7] = 0.9  # an outlier
    return w


def test_int8_is_round_to_nearest_with_an_fp16_scale_per_32():
    w = matrix()
    fmt = WeightFormat.parse("int8")
    qt = quantize(w, fmt)
    n, k = w.shape
    assert str(fmt) == "int8-g32" and qt.q.shape == (n, k) and qt.scales.shape == (n, k // 32)
    amax = np.abs(w.reshape(n, k // 32, 32)).max(axis=2)
    np.testing.assert_array_equal(qt.scales, (amax / 127).astype(np.float16))
    assert qt.q.dtype == np.int8 and np.abs(qt.q).max() == 127 and not qt.q[3].any()
    s = np.repeat(qt.scales.astype(np.float32), 32, axis=1)
    np.testing.assert_array_equal(qt.dequantize(), qt.q.astype(np.float32) * s)
    err = np.abs(qt.dequantize() - w)
    assert (err <= s / 2 * (1 + 1e-6) + np.abs(w) * 2**-10).all()  # half a step (+ the fp16 scale's rounding at the top)
    assert qt.nbytes == fmt.matrix_bytes(w.shape) == n * k + 2 * n * k // 32


@pytest.mark.parametrize("group", [32, 64])
def test_int4_layout_matches_an_element_by_element_reference(group):
    """Two codes a byte (even k low), each the nearest of 0..15 on its group's fp16 (scale,
    minimum) grid, clipped; the dequantized weight is code * scale + minimum. (`--int4-group 64`;
    groups of 32 are a GGUF's carried Q4 blocks.)"""
    w = matrix()
    fmt = WeightFormat("int4", group)
    assert group == 32 or fmt == WeightFormat.parse("int4", group)
    qt = quantize(w, fmt)
    n, k = w.shape
    assert qt.q.shape == (n, k // 2) and qt.scales.shape == (n, k // group, 2) and qt.scales.dtype == np.float16
    assert str(fmt) == f"int4-g{group}+min" and qt.nbytes == fmt.matrix_bytes(w.shape) == n * k // 2 + 4 * n * k // group
    for r in range(n):
        for g in range(k // group):
            s, low = (float(v) for v in qt.scales[r, g])
            for j, v in enumerate(w[r, g * group : (g + 1) * group]):
                col = g * group + j
                want = 0 if s == 0 else int(np.clip(np.rint((np.float32(v) - np.float32(low)) / np.float32(s)), 0, 15))
                byte = int(qt.q[r, col // 2])
                assert (byte >> 4 if col % 2 else byte & 0xF) == want
                assert qt.dequantize(slice(r, r + 1))[0, col] == np.float32(want) * np.float32(s) + np.float32(low)


@pytest.mark.parametrize("fmt", [WeightFormat("int4", 32, min8=True), WeightFormat("int5", 64, min8=True)])
def test_min8_layouts_match_an_element_by_element_reference(fmt):
    """A row's side bytes: its two fp16 steps (ds, dm), int5's fifth bits (bit j of byte i for
    column 8 i + j), then per group the scale's multiple of ds (uint8) and the minimum's of dm
    (int8), zeros to a multiple of 4 bytes. Each code is the nearest of 0..2^b - 1 on its group's
    grid, clipped; the dequantized weight is code * (s8 ds) + m8 dm in float32."""
    w = matrix(24, 256)
    qt = quantize(w, fmt, rng.random(256).astype(np.float32) + 0.1)
    n, k = w.shape
    bits, levels = (4, 15) if fmt.name == "int4" else (5, 31)
    groups = k // fmt.group
    side = 4 + (k // 8 if bits == 5 else 0) + 2 * groups
    assert qt.q.shape == (n, k // 2) and qt.scales.shape == (n, -(-side // 4) * 4) and qt.scales.dtype == np.uint8
    assert qt.nbytes == fmt.matrix_bytes(w.shape) and not qt.scales[:, side:].any()
    assert str(fmt) == f"{fmt.name}-g{fmt.group}+min8" and fmt.grid_levels == levels
    values = qt.dequantize()
    for r in range(n):
        row = bytes(qt.scales[r])
        ds, dm = (float(v) for v in np.frombuffer(row[:4], "<f2"))
        pairs = row[side - 2 * groups : side]
        for g in range(groups):
            s = np.float32(pairs[2 * g] * ds)
            low = np.float32(int.from_bytes(pairs[2 * g + 1 : 2 * g + 2], "little", signed=True) * dm)
            for j in range(fmt.group):
                col = g * fmt.group + j
                want = 0 if s == 0 else int(np.clip(np.rint((w[r, col] - low) / s), 0, levels))
                byte = int(qt.q[r, col // 2])
                code = (byte >> 4 if col % 2 else byte & 0xF) | ((row[4 + col // 8] >> (col % 8) & 1) << 4 if bits == 5 else 0)
                assert code == want
                assert values[r, col] == np.float32(code) * s + low
    assert (values[3] == 0).all()  # an all-zero row stays zero
    # Quality (measured: 7.8% / 4.6% relative RMS error), and the outlier's group keeps it:
    assert np.sqrt(((values - w) ** 2).mean()) / w.std() < (0.1 if bits == 4 else 0.06) and abs(values[5, 7] - 0.9) < 0.05


def test_int4_grids_are_no_worse_than_each_groups_min_and_max():
    """The refitted grid's error, group by group, is at most that of the plain min-max grid (what
    the refits start from, kept only where they improve), and lower overall."""
    w = matrix(64, 256)
    qt = quantize(w, WeightFormat("int4", 32))
    groups = w.reshape(64, 8, 32)
    lo, hi = groups.min(axis=2), groups.max(axis=2)
    s = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
    low = lo.astype(np.float16).astype(np.float32)
    plain = np.clip(np.rint((groups - low[..., None]) / np.where(s == 0, 1, s)[..., None]), 0, 15) * s[..., None] + low[..., None]
    plain_err = ((plain - groups) ** 2).sum(axis=2)
    ours_err = ((qt.dequantize().reshape(groups.shape) - groups) ** 2).sum(axis=2)
    assert (ours_err <= plain_err * (1 + 1e-5) + 1e-12).all() and ours_err.sum() < 0.95 * plain_err.sum()
    assert (qt.dequantize()[3] == 0).all()  # an all-zero row stays zero


def test_quantized_products_are_the_products_of_the_dequantized_matrix_and_batch_invariant():
    w = rng.standard_normal((2100, 64)).astype(np.float32) * 0.05  # more than one W_ROWS block
    x = rng.standard_normal((37, 64)).astype(np.float32)
    for fmt in (WeightFormat.parse("int8"), WeightFormat.parse("int4"), WeightFormat("int5", 64, min8=True)):
        qt = quantize(w, fmt)
        ours = matmul_rows(x, qt)
        np.testing.assert_allclose(ours, x.astype(np.float64) @ qt.dequantize().T.astype(np.float64), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(matmul_rows(x[5:6], qt)[0], ours[5])  # bit-identical alone


def test_the_writer_makes_files_the_safetensors_library_reads(tmp_path):
    arrays = {"a.q": rng.integers(-127, 128, (5, 8)).astype(np.int8), "a.scales": rng.random(5).astype(np.float32),
              "b": rng.integers(0, 255, (3, 4)).astype(np.uint8), "c": rng.random((2, 3)).astype(np.float16)}
    path = tmp_path / "x.safetensors"
    entries = [(n, {np.int8: "I8", np.float32: "F32", np.uint8: "U8", np.float16: "F16"}[a.dtype.type], a.shape)
               for n, a in arrays.items()]
    with SafetensorsWriter(path, entries, {"format": "int8"}) as w:
        for n, a in arrays.items():
            w.write(n, a)
    back = safetensors.numpy.load_file(path)
    assert set(back) == set(arrays)
    for n, a in arrays.items():
        np.testing.assert_array_equal(back[n], a)
    with pytest.raises(ValueError, match="expected a.q"):
        SafetensorsWriter(tmp_path / "y.safetensors", entries, {}).write("b", arrays["b"])


@pytest.fixture
def tiny(tmp_path):
    make_causal_lm(tmp_path / "m", head_dim=32, hidden_size=64, intermediate_size=128)
    from safetensors.torch import load_file, save_file  # store bf16 as a hub checkpoint does

    path = tmp_path / "m" / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    cfg = Gemma3Config.from_dir(tmp_path / "m")
    return tmp_path / "m", cfg


def drain(loaded):
    return {name: t for name, t in loaded.tensors}


def same(a, b):
    if hasattr(a, "q"):
        return np.array_equal(a.q, b.q) and np.array_equal(a.scales, b.scales) and a.format == b.format
    return a.dtype == b.dtype and np.array_equal(a.data, b.data)


@pytest.mark.parametrize("weights", ["int8", "int4", "fp16"])
def test_the_cache_is_written_once_and_read_back_identically(tiny, tmp_path, monkeypatch, weights):
    model, cfg = tiny
    fmt, ckpt = WeightFormat.parse(weights), Checkpoint.open(model, cfg)
    root = tmp_path / "cache"
    first = load_converted(ckpt, fmt, root)
    converted = drain(first)
    assert "converted" in first.note[0]
    (entry,) = (root / "weights").glob("*.safetensors")
    sizes = converted_nbytes_by_dtype(ckpt.layout, fmt)
    assert sum(sizes.values()) == sum(t.nbytes if hasattr(t, "q") else t.data.nbytes for t in converted.values())

    monkeypatch.setattr(quant_cache, "convert", lambda *a: pytest.fail("converted again despite the cache"))
    second = load_converted(ckpt, fmt, root)
    again = drain(second)
    assert "read from the cache" in second.note[0]
    assert list(again) == list(converted) and all(same(again[n], converted[n]) for n in converted)
    assert converted["norm.weight"].dtype == "BF16"  # norms stay as stored
    if weights == "int4":
        assert converted["embed_tokens.weight"].format.name == "int8"
        assert converted["layers.0.mlp.up_proj.weight"].format == WeightFormat("int5", 64, min8=True)  # (the hidden state feeds it)
        assert converted["layers.0.mlp.down_proj.weight"].format == fmt


def test_a_damaged_entry_is_rebuilt_and_a_changed_checkpoint_gets_its_own(tiny, tmp_path):
    model, cfg = tiny
    fmt, root = WeightFormat.parse("int8"), tmp_path / "cache"
    reference = drain(load_converted(Checkpoint.open(model, cfg), fmt, root))
    (entry,) = (root / "weights").glob("*.safetensors")
    with entry.open("r+b") as f:
        f.truncate(entry.stat().st_size - 10)
    rebuilt = load_converted(Checkpoint.open(model, cfg), fmt, root)
    assert all(same(t, reference[n]) for n, t in rebuilt.tensors) and "converted" in rebuilt.note[0]

    path = model / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same size, same header: only the content differs
    path.write_bytes(bytes(data))
    os.utime(path, ns=(1, 1))
    drain(load_converted(Checkpoint.open(model, cfg), fmt, root))
    assert len(list((root / "weights").glob("*.safetensors"))) == 2


def test_a_conversion_stopped_midway_leaves_no_entry(tiny, tmp_path):
    model, cfg = tiny
    root = tmp_path / "cache"
    loaded = load_converted(Checkpoint.open(model, cfg), WeightFormat.parse("int4"), root)
    next(loaded.tensors)
    loaded.tensors.close()  # the consumer gave up (out of device memory, say)
    assert [p.name for p in (root / "weights").iterdir()] == ["digests.json"]


def test_kv_formats_round_as_specified():
    x = (rng.standard_normal((50, 3, 16)) * 3).astype(np.float32)
    x[7, 1] = 0.0
    slots = rng.permutation(64)[:50]
    for kv, tol in (("fp32", 0), ("fp16", 2**-11), ("bf16", 2**-8)):
        store = KVStore(kv, 64, 3, 16)
        store.write(slots, x)
        back = store.read(slots)
        assert (np.abs(back - x) <= tol * np.abs(x)).all()
    torch_bf16 = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_round(x), torch_bf16)
    store = KVStore("int8", 64, 3, 16)
    store.write(slots, x)
    s = np.abs(x).max(axis=-1, keepdims=True) / 127
    err = np.abs(store.read(slots) - x)
    assert (err <= s / 2 * 1.0001 + 1e-12).all() and (store.read(slots)[7, 1] == 0).all()
    assert store.nbytes == 64 * 3 * 16 + 64 * 3 * 4


def test_a_quantized_product_never_holds_the_dequantized_matrix():
    import tracemalloc

    qt = quantize(rng.standard_normal((8192, 256)).astype(np.float32), WeightFormat.parse("int8"))
    x = rng.standard_normal((4, 256)).astype(np.float32)
    tracemalloc.start()
    matmul_rows(x, qt)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8192 * 256 * 4 / 2  # half the float32 matrix: a block of output rows and its temporaries


@pytest.mark.parametrize("weights, group, layers, embedding", [
    ("int8", 32, 8 + 16 / 32, 8 + 16 / 32),  # a code, and an fp16 scale per 32
    # min8, by hand for H 64, q 128, k and v 64, I 128: q, k, v, gate and up (32,768 weights) int5 in
    # groups of 64 (128 does not divide 64 columns), a row 32 bytes of low bits, 4 of steps, 8 of
    # fifth bits, 2 of pairs, 2 of padding: 6 bits a weight; o and down (8,192 each) int4 in groups
    # of 32, a row of 128 in 64 + 4 + 8 bytes. (A row's 4 bytes of steps weigh less in wider rows:
    # the real 270M's layers take 4.98 bits.)
    ("int4", 32, (32768 * 48 + 16384 * 76 / 2) * 8 / 64 / 49152, 8 + 16 / 32),
    ("int4", 64, 4 + 32 / 64, 8 + 16 / 32),
])
def test_a_conversion_says_its_bits_a_weight_scales_included(tmp_path, weights, group, layers, embedding):
    model_dir = tmp_path / "tiny"
    make_causal_lm(model_dir, intermediate_size=128, head_dim=32)  # (every K a multiple of 64)
    loaded = load_converted(Checkpoint.open(model_dir, Gemma3Config.from_dir(model_dir)), WeightFormat.parse(weights, group), None)
    list(loaded.tensors)
    assert f"({layers:.2f} bits a weight in the layers' matrices, {embedding:.2f} in the embedding, scales included)" in loaded.note[-1]
