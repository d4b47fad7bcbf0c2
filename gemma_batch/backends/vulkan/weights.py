"""The model's weights in device memory, uploaded once, in the run's weight format.

Matrices stay bf16 / fp16 / fp32 as given (bf16 and fp16 are widened exactly in the shaders), or
int8 / int4 (`model.quant`: the kernels dequantize in registers). A quantized matrix [N, K] is
one buffer: its codes (int8 [N, K], or int4 [N, K / 2] bytes), then its scales (fp16 [N, K / 32],
or fp16 (scale, minimum) pairs [N, K / group, 2]), so the scales start at byte N K (int8) or
N K / 2 (int4), where the shaders find them. Norm weights are stored fp32. Layout changes happen here, at upload: q, k
and v of a layer go into one [(nh + 2 nkv) * hd, H] matrix so that the projection is one
dispatch (codes and scales each in row order); q_norm and k_norm share one [2 * hd] buffer.

With `tiles` (a device that runs the cooperative-matrix path), every bf16 / fp16 matrix that path
takes (coop_tiles.coop_fits) is stored as fp16 in 16 x 16 tiles ("T16"): tile (nt, kt) of a
[N, K] matrix is W[16 nt : 16 nt + 16, 16 kt : 16 kt + 16], row-major, at half (nt K / 16 + kt)
256, so the 16 rows of a strip stay where their rows were (`fp16_tiles`). bf16 -> fp16 is exact
in fp16's normal range; values beyond it are clamped, as the kernels did when they converted
while staging. The matrix units load a tile in one piece; the embedding lookup reads rows out
of the tiles when the table is also the LM head. Where the device's matrix units hold a tile in
the order fragment_order.py knows, each tile's 256 values are stored in that order instead
(`fragment_order`), so that a lane loads its part of a tile in one 16-byte load; there int8
matrices of that path go into the same tiles too ("T8", `int8_tiles`: fragment_order.int8_tiles),
their scales beside, in the bytes their rows' scales would take.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...model.checkpoint import Tensor, to_float32
from ...model.config import Gemma3Config
from ...model.quant import QuantizedTensor, to_fp16
from ...model.weights import tensor_shapes
from ...startup import phase
from ..placement import Segment, held_tensors
from .coop_tiles import coop_fits
from .fragment_order import fragment_tiles, int8_tiles as int8_tile_layout
from .coopmat import TILE
from .variants import EMBED_DTYPES
from .kernels import Kernels
from .memory import Buffer, Memory
from . import tile_upload

_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_QK_NORM = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_MATRICES = ("self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
          "post_feedforward_layernorm.weight")
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}
Matrix = Tensor | QuantizedTensor
_TILE_BLOCK_ROWS = 1024  # rows converted to tiles per task, by _TILE_WORKERS threads
_TILE_WORKERS = min(8, os.cpu_count() or 1)


def _storage(tensor: Matrix) -> str:
    """The shaders' storage type of a matrix: its dtype, or I8 / I4 / Q4 / Q5 (int8, int4, min8 int4 / int5)."""
    if not isinstance(tensor, QuantizedTensor):
        return tensor.dtype
    fmt = tensor.format
    return {"int8": "I8", "int4": "Q4" if fmt.min8 else "I4", "int5": "Q5"}[fmt.name]


def _group(tensor: Matrix) -> int:
    return tensor.format.group if isinstance(tensor, QuantizedTensor) else 0


def fp16_bits(tensor: Tensor, refuse_non_finite: bool = False) -> np.ndarray:
    """A bf16 or fp16 tensor's values as fp16 bits (uint16), rounded to nearest even and clamped
    to fp16's range; with `refuse_non_finite`, ValueError for a bf16 NaN or infinity (a damaged
    checkpoint, whose NaNs the clamp could hide from the logits' check). A bf16 value in fp16's normal range converts exactly by rebasing its
    exponent (integer arithmetic, about 4x faster than through float32); the rest (zeros, fp16
    subnormals, values beyond 65504, inf / nan) go through float32."""
    if tensor.dtype == "F16":
        return tensor.data.view(np.uint16)
    bits = tensor.data
    magnitude = bits & np.uint16(0x7FFF)
    out = magnitude - np.uint16(0x3800)  # exponent 127 - 15 lower: bf16 bias -> fp16 bias (<< 7)
    out <<= 3  # 7 mantissa bits -> 10
    out |= bits & np.uint16(0x8000)
    rest = np.flatnonzero((magnitude < 0x3880) | (magnitude >= 0x4780))  # exponents outside 113..142
    if rest.size:
        values = (bits.reshape(-1)[rest].astype(np.uint32) << 16).view(np.float32)
        if refuse_non_finite and not np.isfinite(values).all():
            raise ValueError(f"holds {np.count_nonzero(~np.isfinite(values))} NaN or infinite value(s): the checkpoint "
                             "is damaged (gemma-batch inspect MODEL --verify lists every such tensor)")
        out.reshape(-1)[rest] = to_fp16(values).view(np.uint16)
    return out


def fp16_tiles(tensor: Tensor, fragment_order: bool = False) -> np.ndarray:
    """A bf16 or fp16 matrix [R, K] (R and K multiples of 16) as fp16 16 x 16 tiles
    [R / 16, K / 16, 16, 16] (see the module doc), or with `fragment_order` each tile's 256 values
    in the matrix units' fragment order (fragment_order.py): [R / 16, K / 16, 256]. ValueError
    for a bf16 NaN or infinity (fp16_bits)."""
    rows, cols = tensor.data.shape
    half = fp16_bits(tensor, refuse_non_finite=True).view(np.float16)
    if fragment_order:
        return fragment_tiles(half)
    return np.ascontiguousarray(half.reshape(rows // TILE, TILE, cols // TILE, TILE).transpose(0, 2, 1, 3))


def _values(tensor: Matrix) -> np.ndarray:
    """A matrix's codes, or its values when not quantized: [N, ...] in rows."""
    return tensor.q if isinstance(tensor, QuantizedTensor) else tensor.data


def _row_bytes(tensor: Matrix) -> tuple[int, int]:
    """Bytes per row of a matrix's codes (its values, when not quantized) and of its scales (0 then)."""
    if isinstance(tensor, QuantizedTensor):
        return tensor.q.shape[1] * tensor.q.itemsize, tensor.scales[0].nbytes
    return tensor.data.shape[1] * _ITEMSIZE[tensor.dtype], 0


class DeviceWeights:
    """Per layer: `qkv`, `o_proj`, `gate_proj`, `up_proj`, `down_proj` (matrices), `qk_norm` and
    the four block norms (fp32); globally `embed`, `lm_head` (the embedding when tied), `norm`.
    `dtypes` gives each matrix's storage dtype ("BF16" | "F16" | "F32" | "I8" | "I4" | "Q4" | "Q5" |
    "T16" | "T8"), `group` its weights per scale of I4 / Q4 / Q5 (the shaders' pc.group). `tiles`:
    store the matrices of the cooperative-matrix path as fp16 tiles (the module doc), with
    `fragment_order` each tile in the matrix units' fragment order (fragment_order.py), and with
    `int8_tiles` as well their int8 matrices in fragment-order tiles ("T8")."""

    def __init__(self, cfg: Gemma3Config, memory: Memory, tiles: bool = False, fragment_order: bool = False,
                 segments: Sequence[Segment] | None = None, kernels: Kernels | None = None,
                 int8_tiles: bool = False) -> None:
        """`segments`: a pipeline stage's parts, whose tensors alone it holds (None: every tensor).
        `kernels`: make the tiles on the device with them (tile_upload.py; None: on the host)."""
        self.cfg = cfg
        self.kernels = kernels if tile_upload.wanted() else None
        self._tile_upload: tile_upload.TileUpload | None = None  # while `load` runs
        self.segments = segments
        self.mem = memory
        self.tiles = tiles
        self.fragment_order = fragment_order
        self.int8_tiles = tiles and fragment_order and int8_tiles
        self.layers: list[dict[str, Buffer]] = [{} for _ in range(cfg.num_layers)]
        self.globals: dict[str, Buffer] = {}
        self.dtypes: dict[tuple[int, str], str] = {}  # (layer or -1, key) -> dtype
        self.groups: dict[tuple[int, str], int] = {}  # (layer or -1, key) -> weights per scale (0: none)

    def buffer(self, layer: int, key: str) -> Buffer:
        return self.globals[key] if layer < 0 else self.layers[layer][key]

    def dtype(self, layer: int, key: str) -> str:
        return self.dtypes[(layer, key)]

    def group(self, layer: int, key: str) -> int:
        """Weights per scale (and minimum) of a matrix of I4, Q4 or Q5 weights: the shaders' pc.group."""
        return self.groups.get((layer, key), 0)

    def load(self, tensors: Iterable[tuple[str, Matrix]]) -> None:
        cfg = self.cfg
        expected = tensor_shapes(cfg) if self.segments is None else held_tensors(
            tensor_shapes(cfg), self.segments, cfg.num_layers, cfg.tie_word_embeddings)
        seen: set[str] = set()
        if self.tiles and self.kernels is not None:
            self._tile_upload = tile_upload.TileUpload(self.kernels, self.mem, self.fragment_order)
        try:
            for name, tensor in tensors:
                seen.add(name)
                self._tensor(name, tensor)
        finally:
            if self._tile_upload is not None:
                self._tile_upload.close()
                self._tile_upload = None
        missing = sorted(set(expected) - seen)
        if missing:
            raise ValueError(f"backend received no tensor for {', '.join(missing[:5])} ({len(missing)} missing)")
        if (-1, "embed") in self.dtypes and self.dtypes[(-1, "embed")] not in EMBED_DTYPES:
            raise ValueError(f"embed_tokens.weight: the Vulkan embedding lookup reads {', '.join(EMBED_DTYPES)}, "
                             f"not {self.dtypes[(-1, 'embed')]}")
        if "lm_head" not in self.globals and "embed" in self.globals:
            self.globals["lm_head"] = self.globals["embed"]
            self.dtypes[(-1, "lm_head")] = self.dtypes[(-1, "embed")]

    def _tensor(self, name: str, tensor: Matrix) -> None:
        if name in ("embed_tokens.weight", "lm_head.weight"):
            key = "embed" if name == "embed_tokens.weight" else "lm_head"
            self.globals[key] = self._matrix(-1, key, tensor, name)
        elif name == "norm.weight":
            self.globals["norm"] = self.mem.uploaded(to_float32(tensor), name)
        else:
            _, index, suffix = name.split(".", 2)
            self._layer_tensor(int(index), suffix, tensor, name)

    def _layer_tensor(self, layer: int, suffix: str, tensor: Matrix, name: str) -> None:
        cfg, slots = self.cfg, self.layers[layer]
        if suffix in _QKV:
            rows = cfg.q_width + 2 * cfg.kv_width
            tiled = self._tile_dtype(tensor, rows) if cfg.q_width % TILE == 0 and cfg.kv_width % TILE == 0 else None
            dtype = tiled or self._check_dtype(tensor, name)
            code_row, scale_row = _row_bytes(tensor)
            group = _group(tensor)
            if (layer, "qkv") not in self.dtypes:
                slots["qkv"] = self.mem.alloc(rows * (code_row + scale_row), f"{name} (fused qkv)")
                self.dtypes[(layer, "qkv")], self.groups[(layer, "qkv")] = dtype, group
            elif (self.dtypes[(layer, "qkv")], self.groups[(layer, "qkv")]) != (dtype, group):
                raise ValueError(f"{name} is {dtype} (groups of {group}) but the layer's other q/k/v weights are "
                                 f"{self.dtypes[(layer, 'qkv')]} (groups of {self.groups[(layer, 'qkv')]}); "
                                 f"the fused projection needs one layout")
            first_row = (0, cfg.q_width, cfg.q_width + cfg.kv_width)[_QKV.index(suffix)]
            self._upload_rows(slots["qkv"], tensor, first_row, rows, tiled, name)
        elif suffix in _QK_NORM:
            if "qk_norm" not in slots:
                slots["qk_norm"] = self.mem.alloc(2 * cfg.head_dim * 4, f"layer {layer} q/k norms")
            self.mem.upload(slots["qk_norm"], to_float32(tensor), _QK_NORM.index(suffix) * cfg.head_dim * 4)
        elif suffix in _MATRICES:
            key = suffix.split(".")[1]
            slots[key] = self._matrix(layer, key, tensor, name)
        elif suffix in _NORMS:
            slots[suffix.split(".")[0]] = self.mem.uploaded(to_float32(tensor), name)
        else:
            raise ValueError(f"unexpected tensor {name}")

    def _matrix(self, layer: int, key: str, tensor: Matrix, name: str) -> Buffer:
        quantized = isinstance(tensor, QuantizedTensor)
        rows = len(_values(tensor))
        # The embedding is tiled only when it is also the LM head (tied), which reads it as a matrix.
        tiled = None if key == "embed" and not self.cfg.tie_word_embeddings else self._tile_dtype(tensor, rows)
        self.dtypes[(layer, key)] = tiled or self._check_dtype(tensor, name)
        self.groups[(layer, key)] = _group(tensor)
        buf = self.mem.alloc(tensor.nbytes if quantized else tensor.data.nbytes, name)
        self._upload_rows(buf, tensor, 0, rows, tiled, name)
        return buf

    def _tile_dtype(self, tensor: Matrix, rows: int) -> str | None:
        """The tiles a matrix of `rows` rows (fused: the whole) goes into: "T16" (fp16), "T8" (int8
        in fragment order), or None (rows)."""
        if not (self.tiles and coop_fits(rows, _values(tensor).shape[1])):
            return None
        if isinstance(tensor, QuantizedTensor):
            return "T8" if self.int8_tiles and tensor.format.name == "int8" else None
        return "T16" if tensor.dtype in ("BF16", "F16") else None

    def _check_dtype(self, tensor: Matrix, name: str) -> str:
        dtype = _storage(tensor)
        if not isinstance(tensor, QuantizedTensor) and dtype not in _ITEMSIZE:
            raise ValueError(f"{name}: dtype {dtype} is not supported by the Vulkan backend (BF16, F16, F32, int8, int4, int5)")
        return dtype

    def _upload_rows(self, buf: Buffer, tensor: Matrix, first_row: int, rows: int, tiled: str | None, name: str) -> None:
        """Put `tensor` (`name`)'s rows at row `first_row` of the [rows, K] matrix held in `buf`:
        codes in the codes' part, scales in the scales' part, or as `tiled` tiles (see the module doc)."""
        code_row, scale_row = _row_bytes(tensor)
        if tiled == "T16" and self._tile_upload is not None:
            self._tile_upload.upload(buf, tensor.data.view(np.uint16), tensor.dtype == "BF16", first_row, name)
        elif tiled:  # a strip of 16 rows occupies the bytes its rows would: upload blocks of strips
            def convert(start: int) -> list[tuple[int, np.ndarray]]:
                """Rows [start, start + _TILE_BLOCK_ROWS) as tiles: (byte offset in `buf`, array) pairs."""
                end, row = start + _TILE_BLOCK_ROWS, first_row + start
                if isinstance(tensor, QuantizedTensor):  # T8
                    codes, scales = int8_tile_layout(tensor.q[start:end], tensor.scales[start:end])
                    return [(row * code_row, codes), (rows * code_row + row * scale_row, scales)]
                try:
                    return [(row * code_row, fp16_tiles(Tensor(tensor.dtype, tensor.data[start:end]), self.fragment_order))]
                except ValueError as e:
                    raise ValueError(f"{name} {e}") from None

            pending: deque = deque()  # futures of converted blocks: converting while earlier blocks upload
            with ThreadPoolExecutor(_TILE_WORKERS) as pool:  # numpy converts outside the GIL
                for start in range(0, len(_values(tensor)), _TILE_BLOCK_ROWS):
                    pending.append(pool.submit(convert, start))
                    if len(pending) > 2 * _TILE_WORKERS:  # bounds the converted blocks held
                        self._upload_tiles(buf, pending.popleft())
                for done in pending:
                    self._upload_tiles(buf, done)
        else:
            with phase("weights: upload"):
                if isinstance(tensor, QuantizedTensor):
                    self.mem.upload(buf, tensor.q, first_row * code_row)
                    self.mem.upload(buf, tensor.scales, rows * code_row + first_row * scale_row)
                else:
                    self.mem.upload(buf, tensor.data, first_row * code_row)

    def _upload_tiles(self, buf: Buffer, converted: Future) -> None:
        """Upload a block of strips once converted (the wait counted as conversion: the upload overlaps the rest)."""
        with phase("weights: fp16 tiles"):
            parts = converted.result()
        with phase("weights: upload"):
            for offset, array in parts:
                self.mem.upload(buf, array, offset)

    @property
    def nbytes(self) -> int:
        seen = {id(b): b.size for layer in self.layers for b in layer.values()}
        seen |= {id(b): b.size for b in self.globals.values()}
        return sum(seen.values())
