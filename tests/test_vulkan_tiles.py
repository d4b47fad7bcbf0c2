"""fp16 16 x 16 tiles, the weight layout of the cooperative-matrix path (vulkan/weights.py), and
int8 in such tiles (T8): the layouts themselves in numpy, which matrices DeviceWeights tiles and
what it uploads (read back from the device), and embed.comp's W_T16 and W_T8 lookups reading rows
out of the tiles. These run on any Vulkan
device (llvmpipe in CI); the matmuls that read the tiles need cooperative matrices and are
checked on the GPU machine (test_vulkan_split.py, test_vulkan_coopmat.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.fragment_order import ORDER, int8_tiles
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.tile_upload import TileUpload
from gemma_batch.backends.vulkan.weights import DeviceWeights, fp16_bits, fp16_tiles
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint, Tensor, to_float32
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import QuantizedTensor, WeightFormat, quantize
from gemma_batch.model.quant_cache import load_converted
from tests.test_cpu_vs_transformers import checkpoints  # noqa: F401
from tests.vulkan_dispatch import Dispatches


def untile(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return flat.reshape(rows // 16, cols // 16, 16, 16).transpose(0, 2, 1, 3).reshape(rows, cols)


def bf16(values: np.ndarray) -> Tensor:
    return Tensor("BF16", (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16))


def test_bf16_converts_to_fp16_as_numpy_rounds_it():
    """The integer fast path and the float32 path for the rest, against numpy's float32 -> fp16,
    over every bf16 bit pattern but nan."""
    every = Tensor("BF16", np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
    values = to_float32(every)
    keep = ~np.isnan(values)
    expected = np.clip(values, -65504, 65504).astype(np.float16)
    assert np.array_equal(fp16_bits(every)[keep], expected.view(np.uint16)[keep])


def test_a_nan_or_infinity_is_refused_on_its_way_into_tiles():
    """Clamped into fp16's range an infinity would look finite, and a NaN may come out of the
    matrix units as anything: a damaged checkpoint must fail at the upload, not compute."""
    for bad in (np.nan, np.inf, -np.inf):
        w = np.ones((16, 32), np.float32)
        w[3, 30] = bad
        with pytest.raises(ValueError, match="1 NaN or infinite value"):
            fp16_tiles(bf16(w))


def test_a_tile_holds_a_16_by_16_block_row_major():
    rng = np.random.default_rng(0)
    w = to_float32(bf16(rng.standard_normal((48, 64))))
    w[5, 7], w[40, 63] = 1e6, -1e6  # beyond fp16: clamped
    tiles = fp16_tiles(bf16(w))
    assert tiles.dtype == np.float16 and tiles.shape == (3, 4, 16, 16)
    flat = tiles.reshape(-1)
    for n, k in [(0, 0), (17, 33), (47, 63), (5, 7), (40, 63)]:
        at = ((n // 16) * (64 // 16) + k // 16) * 256 + (n % 16) * 16 + k % 16
        assert flat[at] == np.float16(np.clip(w[n, k], -65504, 65504)), (n, k)
    assert flat[(0 * 4 + 0) * 256 + 5 * 16 + 7] == np.float16(65504)


def _loaded(model_dir) -> tuple[DeviceWeights, Memory, Device, dict]:
    cfg = Gemma3Config.from_dir(model_dir)
    device = Device()
    mem = Memory(device)
    weights = DeviceWeights(cfg, mem, tiles=True)
    tensors = dict(Checkpoint.open(model_dir, cfg).tensors())
    weights.load(tensors.items())
    return weights, mem, device, tensors


def test_the_demo_model_goes_into_tiles_whole():
    weights, mem, device, tensors = _loaded(DEMO_MODEL)
    try:
        cfg = weights.cfg
        for key in ("qkv", "o_proj", "gate_proj", "up_proj", "down_proj"):
            assert weights.dtype(0, key) == "T16", key
        assert weights.dtype(-1, "embed") == weights.dtype(-1, "lm_head") == "T16"  # tied: one table
        q, k, v = (to_float32(tensors[f"layers.1.self_attn.{p}_proj.weight"]) for p in "qkv")
        fused = np.concatenate([q, k, v])
        got = untile(mem.download(weights.buffer(1, "qkv")).view(np.float16), *fused.shape)
        assert np.array_equal(got, fused.astype(np.float16))
        down = to_float32(tensors["layers.3.mlp.down_proj.weight"])
        got = untile(mem.download(weights.buffer(3, "down_proj")).view(np.float16), *down.shape)
        assert np.array_equal(got, down.astype(np.float16))
        assert cfg.tie_word_embeddings
    finally:
        mem.close()
        device.close()


def test_matrices_the_cooperative_path_cannot_take_stay_as_they_are(checkpoints):  # noqa: F811
    """The tiny model: qkv is 192 x 64 (tiled); o (K = 96), gate/up (N = 96), down and the
    300-row embedding do not fit the path's 64-wide tiles and stay bf16."""
    weights, mem, device, tensors = _loaded(checkpoints["bf16"][0])
    try:
        assert weights.dtype(0, "qkv") == "T16"
        for key in ("o_proj", "gate_proj", "up_proj", "down_proj"):
            assert weights.dtype(0, key) == "BF16", key
        assert weights.dtype(-1, "embed") == "BF16"
        o = tensors["layers.0.self_attn.o_proj.weight"].data
        assert np.array_equal(mem.download(weights.buffer(0, "o_proj")).view(np.uint16).reshape(o.shape), o)
    finally:
        mem.close()
        device.close()


def test_fragment_order_is_the_order_the_h100_driver_gives():
    """fragment_order.ORDER against the components coop_fragment_probe.comp read on the H100
    (driver 580.159.04; `git show 4d73df3:benchmarks/results/2026-11-24-h100-weight-loads/out/8-probe.txt`): lane
    4 g + t holds (g, 2t), (g, 2t + 1), (g, 2t + 8), (g, 2t + 9), then the same columns of row
    g + 8. (PTX's m16n8k16 A fragment has these elements, but a2, a3 in row g + 8.)"""
    expected = []
    for lane in range(32):
        g, t = divmod(lane, 4)
        for row in (g, g + 8):
            for col in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9):
                expected.append(16 * row + col)
    assert ORDER.tolist() == expected
    assert sorted(expected) == list(range(256))  # every element of the tile once


@pytest.mark.parametrize("fragment_order", [False, True])
def test_the_embedding_lookup_reads_rows_out_of_tiles(fragment_order):
    """Row-major tiles, and tiles in fragment order read through embed.comp's own formula
    (specialization constant 6 on)."""
    rng = np.random.default_rng(3)
    V, H, scale = 64, 96, 9.797959
    table = (rng.standard_normal((V, H)) * 0.05).astype(np.float32)
    tokens = np.array([0, 17, 63, 40, 17], np.int32)
    tiles = fp16_tiles(bf16(table), fragment_order)
    if fragment_order:  # the same tiles as row-major ones, each reordered by ORDER
        assert np.array_equal(tiles.reshape(-1, 256)[:, ORDER.argsort()], fp16_tiles(bf16(table)).reshape(-1, 256))
    with Dispatches(tokens=len(tokens), fragment_loads=fragment_order) as d:
        x = d.alloc(len(tokens) * H * 4, "x")
        d.dispatch("embed_t16", {0: d.upload(tiles, "table"), 1: d.upload(tokens, "tokens"), 2: x},
                   {"H": H, "scale": scale, "V": V}, len(tokens))
        d.run()
        x = d.download(x).view(np.float32).reshape(len(tokens), H)
    expected = to_float32(bf16(table)).astype(np.float16).astype(np.float32)[tokens] * np.float32(scale)
    assert np.array_equal(x, expected)


@pytest.mark.parametrize("fragment_order", [False, True])
def test_tiles_made_on_the_device_are_the_hosts_bit_for_bit(fragment_order):
    """tiles.comp (tile_upload.py) against fp16_tiles: every bf16 bit pattern but NaN and the
    infinities (the fp16 subnormals rounded to nearest even, the clamp beyond 65504), in both
    tile orders, into rows of a fused buffer after others; fp16 rows copied as they are."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = every[~np.isnan(to_float32(Tensor("BF16", every))) & np.isfinite(to_float32(Tensor("BF16", every)))]
    rows = np.resize(finite, 48 * 1408).reshape(48, 1408)  # 67,584 values: every finite pattern at least once
    halves = np.random.default_rng(5).standard_normal((32, 1408)).astype(np.float16)
    device = Device()
    mem = Memory(device)
    kernels = Kernels.for_model(device, Gemma3Config.from_dir(DEMO_MODEL), x_lo=True)
    try:
        upload = TileUpload(kernels, mem, fragment_order)
        buf = mem.alloc(96 * 1408 * 2, "tiles")
        upload.upload(buf, rows, True, 16, "rows")
        upload.upload(buf, halves.view(np.uint16), False, 64, "halves")
        got = mem.download(buf).view(np.uint16).reshape(96, 1408)
        assert np.array_equal(got[16:64].reshape(-1), fp16_tiles(Tensor("BF16", rows), fragment_order).view(np.uint16).reshape(-1))
        assert np.array_equal(got[64:].reshape(-1), fp16_tiles(Tensor("F16", halves), fragment_order).view(np.uint16).reshape(-1))
        for bad in (0x7F80, 0xFFC1):  # +inf, a NaN
            broken = rows[:16].copy()
            broken[7, 1000] = bad
            with pytest.raises(ValueError, match="broken holds 1 NaN or infinite value"):
                upload.upload(buf, broken, True, 0, "broken")
        upload.close()
    finally:
        kernels.close()
        mem.close()
        device.close()


def _int8_matrix(rows: int, cols: int, seed: int) -> QuantizedTensor:
    rng = np.random.default_rng(seed)
    return quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), WeightFormat.parse("int8"))


def test_int8_tiles_hold_each_code_and_scale_where_the_kernels_read_them():
    """fragment_order.int8_tiles (the T8 layout) against the kernels' own formulas, element by
    element: code (n, k) at byte 8 lane + component of tile (n / 16, k / 16), lane 4 (n % 8) +
    (k % 8) / 2, component k % 2 + 2 ((k % 16) / 8) + 4 ((n % 16) / 8) (embed.comp W_T8); the
    scale of (n, group k / 32) at half (n % 16) / 8 of word (strip n / 16, n % 8, group)."""
    w = _int8_matrix(48, 96, 1)
    codes, pairs = int8_tiles(w.q, w.scales)
    assert codes.dtype == np.int8 and pairs.dtype == np.float16
    assert codes.nbytes == w.q.nbytes and pairs.nbytes == w.scales.nbytes
    flat, words = codes.reshape(-1), pairs.reshape(-1, 2)
    for n in range(48):
        for k in range(96):
            lane, comp = 4 * (n % 8) + (k % 8) // 2, k % 2 + 2 * ((k % 16) // 8) + 4 * ((n % 16) // 8)
            assert flat[((n // 16) * 6 + k // 16) * 256 + 8 * lane + comp] == w.q[n, k], (n, k)
            assert words[((n // 16) * 8 + n % 8) * 3 + k // 32, (n % 16) // 8] == w.scales[n, k // 32], (n, k)


def test_int8_matrices_go_into_tiles_only_where_asked():
    """DeviceWeights stores the demo model's int8 matrices as T8 (int8_tiles' bytes, read back
    from the device) with tiles, fragment order and the switch, and in rows otherwise."""
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    tensors = dict(load_converted(Checkpoint.open(DEMO_MODEL, cfg), WeightFormat.parse("int8"), None).tensors)
    device = Device()
    mem = Memory(device)
    try:
        for fragment_order, int8, expected in ((True, True, "T8"), (True, False, "I8"), (False, True, "I8")):
            weights = DeviceWeights(cfg, mem, tiles=True, fragment_order=fragment_order, int8_tiles=int8)
            weights.load(tensors.items())
            assert {weights.dtype(0, k) for k in ("qkv", "o_proj", "gate_proj", "up_proj", "down_proj")} == {expected}
            assert weights.dtype(-1, "embed") == weights.dtype(-1, "lm_head") == expected
            down = tensors["layers.2.mlp.down_proj.weight"]
            got = mem.download(weights.buffer(2, "down_proj"))
            codes, scales = int8_tiles(down.q, down.scales) if expected == "T8" else (down.q, down.scales)
            assert np.array_equal(got, np.concatenate([codes.reshape(-1).view(np.uint8), scales.reshape(-1).view(np.uint8)]))
            q, k, v = (tensors[f"layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
            if expected == "T8":  # the fused qkv: strips of each matrix where its rows go
                codes, scales = int8_tiles(np.concatenate([q.q, k.q, v.q]), np.concatenate([q.scales, k.scales, v.scales]))
                got = mem.download(weights.buffer(1, "qkv"))
                assert np.array_equal(got, np.concatenate([codes.reshape(-1).view(np.uint8), scales.reshape(-1).view(np.uint8)]))
    finally:
        mem.close()
        device.close()


def test_the_embedding_lookup_reads_int8_rows_out_of_tiles():
    """embed.comp W_T8 against W_I8 on the same codes and scales: every value code * scale * the
    embedding's scale in fp32, bit for bit (rows in different strips, one token twice)."""
    V, H, scale = 64, 96, 9.797959
    table = _int8_matrix(V, H, 4)
    tokens = np.array([0, 17, 63, 40, 17], np.int32)
    codes, pairs = int8_tiles(table.q, table.scales)
    out = {}
    for name, parts in (("embed_i8", (table.q, table.scales)), ("embed_t8", (codes, pairs))):
        data = np.concatenate([p.reshape(-1).view(np.uint8) for p in parts])
        with Dispatches(tokens=len(tokens)) as d:
            x = d.alloc(len(tokens) * H * 4, "x")
            d.dispatch(name, {0: d.upload(data, "table"), 1: d.upload(tokens, "tokens"), 2: x}, {"H": H, "scale": scale, "V": V},
                       len(tokens))
            d.run()
            out[name] = d.download(x).view(np.float32).reshape(len(tokens), H)
    expected = (table.q.astype(np.float32) * np.repeat(table.scales.astype(np.float32), 32, axis=1))[tokens] * np.float32(scale)
    assert np.array_equal(out["embed_i8"], expected)
    assert np.array_equal(out["embed_t8"], expected)
