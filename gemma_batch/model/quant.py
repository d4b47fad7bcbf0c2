"""Weight formats: how a run holds the matrix weights (`--weights auto|bf16|fp16|int8|int4`).

Checkpoints are bf16 (some fp32 or fp16), or a GGUF's conversion, whose quantized matrices are
carried in the int8 and int4 layouts below (model/gguf_convert.py). auto, the default, keeps a
checkpoint's matrices as stored (`weights_label` names what they are); bf16 does too, except that
quantized matrices are dequantized (to float32); another format is made from them at load (and
cached on disk, `model.quant_cache`, which also decides that int4 keeps the embedding table in int8). Only the
matrices are converted (the attention and MLP projections and the embedding table, which is also
the tied LM head): they are all but a fraction of a percent of the bytes. Norm weights stay as
stored.

Layouts (a matrix W is [N out, K in]; every backend reads these same arrays):

* fp16: W as float16, clamped into fp16's range (a bf16 value below 2^-24 in magnitude flushes
  to zero; none of a real checkpoint's weights lies outside fp16's normal range).
* int8: `q` int8 [N, K] and `scales` float16 [N, K / 32], one per 32 weights (llama.cpp's Q8_0
  grain): W[n, k] ~ q[n, k] * scales[n, k // 32], q = round(W / s) with s = max|W| / 127 over the
  group (rounded to fp16 first). 8.5 bits a weight.
* int4 (`--int4-group 64`, and a GGUF's carried Q4 blocks in groups of 32): `q` uint8 [N, K / 2]
  holding two codes per byte (even k in the low nibble, odd k in the high one), each in 0..15, and
  `scales` float16 [N, K / group, 2], a scale and a minimum per group (llama.cpp's Q4_1 / Q4_K
  idea): W[n, k] ~ q * scales[n, g, 0] + scales[n, g, 1], g = k // group. 5.0 bits a weight in
  groups of 32, 4.5 in groups of 64.
* min8 (`--weights int4`, in groups of 32: `int4-g32+min8`, and 5-bit codes, `int5-g64+min8` /
  `int5-g128+min8`, for the matrices the block's normalised hidden state feeds, q/k/v and gate/up:
  `conversion.matrix_format`): each group's scale and minimum as 8-bit multiples of two fp16
  steps a row (llama.cpp's K-quants' idea, its sub-block scales), which frees the bits for 5-bit
  codes. `q` holds the codes' low 4 bits as int4's does; `scales` is uint8 [N, R]: the row's two
  steps (ds, dm; fp16, little endian), int5's fifth bits (K / 8 bytes, bit j of byte i is code
  8 i + j's), then per group the scale's multiple (0..255) and the minimum's (int8, -127..127),
  zeros up to a multiple of 4 bytes. W[n, k] ~ code * (s8 ds) + m8 dm, each product exact in
  float32. On the real 270M (docs/EXPERIMENTS.md, "5-bit codes where the hidden state feeds"):
  4.98 bits a weight in the layers, +4.7% / +4.1% perplexity where int4 with fp16 pairs of 32 gave
  +9.3% / +8.4% at 5.0.

The int4 and min8 grids (`quant_grid.fit_grid`) start at the group's min and max, then their
scale and minimum are refitted by least squares to the codes they give, each kept where it lowers
the group's squared error. That error weighs each weight by its input channel's mean square over
a calibration text where the run has one (`quantize/calibration.py`; llama.cpp's "importance
matrix"): on the real 270M, +9% perplexity rather than +27% for int4.

Rounding is to nearest, ties to even (numpy's `rint`), on the float32 value of W / s (int4:
(W - minimum) / s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .quant_grid import (FP16_MAX, MIN_CODES, SCALE_CODES, fit_grid, fp16_round, grid_codes, group_weights,
                         nonzero, on_steps, row_steps)

FORMATS = ("auto", "bf16", "fp16", "int8", "int4")
FORMATS_HELP = ("Weight format: auto (as stored: a GGUF in its own quantization, a float32 checkpoint fp32), bf16 (as "
                "stored, a GGUF's blocks dequantized), fp16, int8 (a scale per 32 weights) or int4 (calibrated; 5.0 bits a "
                "weight, 4.5 with --int4-group 64; the embedding int8).")
STORED_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}  # a checkpoint's float dtypes, as formats are named
INT4_GROUPS = (32, 64)
INT8_GROUP = 32  # int8 weights per scale
CODE_BITS = {"int8": 8, "int4": 4, "int5": 5}
STEPS_BYTES = 4  # min8: a row's two fp16 steps, first in its `scales`
# A byte of int5's fifth bits -> its 8 codes' bit 4 (16 or 0) as 8 bytes: one gather, 30% faster than unpackbits.
_FIFTH_BITS = (np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") << 4).view("<u8")[:, 0]


@dataclass(frozen=True)
class WeightFormat:
    """A run's or a matrix's weight format; `group` is the weights per scale of int8 (INT8_GROUP),
    int4 and int5 (0 for the others); `min8`: int4 / int5 with each group's scale and minimum as
    8-bit multiples of two fp16 steps a row (the module docstring)."""

    name: str = "bf16"
    group: int = 0
    min8: bool = False

    @classmethod
    def parse(cls, name: str, int4_group: int = 32) -> WeightFormat:
        """The format `name` (one of FORMATS); `int4_group` applies to int4 only: 32 is the min8
        layout (int5 in q/k/v and gate/up: `conversion.matrix_format`), 64 fp16 pairs (4.5 bits)."""
        if name not in FORMATS:
            raise ValueError(f"unknown weight format {name!r}; choose one of {', '.join(FORMATS)}")
        if name == "int8":
            return cls(name, INT8_GROUP)
        if name != "int4":
            return cls(name)
        if int4_group not in INT4_GROUPS:
            raise ValueError(f"int4 group size must be one of {INT4_GROUPS}, not {int4_group}")
        return cls(name, int4_group, min8=int4_group == 32)

    def __str__(self) -> str:
        """The format with its grain: int8-g32, int4-g64+min (an fp16 minimum beside each scale),
        int5-g64+min8 (both 8-bit)."""
        if self.name == "int8":
            return f"int8-g{self.group}"
        if self.name in ("int4", "int5"):
            return f"{self.name}-g{self.group}+min{'8' if self.min8 else ''}"
        return self.name

    @property
    def grid_levels(self) -> int:
        """The highest code of a format with a grid (scale and minimum): 15 (int4), 31 (int5); 0 else."""
        return (1 << CODE_BITS[self.name]) - 1 if self.name in ("int4", "int5") else 0

    def converts(self, shape: tuple[int, ...]) -> bool:
        """Whether this format changes a float tensor of `shape` (a matrix, for any format but auto and bf16)."""
        return self.name not in ("auto", "bf16") and len(shape) == 2

    def pairs_at(self, k: int) -> int:
        """min8: where a row's pairs start in its `scales`: after the steps and int5's fifth bits."""
        return STEPS_BYTES + (k // 8 if self.name == "int5" else 0)

    def side_bytes(self, k: int) -> int:
        """min8: bytes of a row's `scales` (steps, int5's fifth bits, the pairs, padding to 4)."""
        return -(-(self.pairs_at(k) + 2 * (k // self.group)) // 4) * 4

    def matrix_bytes(self, shape: tuple[int, int]) -> int:
        """Bytes a [N, K] matrix takes in this format (data and scales)."""
        n, k = shape
        if self.name == "int8":
            return n * k + 2 * n * (k // self.group)
        if self.min8:
            return n * (k // 2 + self.side_bytes(k))
        if self.name == "int4":
            return n * k // 2 + 4 * n * (k // self.group)
        return 2 * n * k

    def check_shape(self, tensor_name: str, shape: tuple[int, int]) -> None:
        """int8, int4 and int5 need K to be a whole number of groups."""
        if self.group and shape[1] % self.group:
            raise ValueError(f"{tensor_name}: {shape[1]} columns are not a multiple of the {self.name} group {self.group}")


_QUANTIZED = (WeightFormat.parse("int8"), *(WeightFormat("int4", g) for g in INT4_GROUPS))  # the carried ones


def entry_shapes(fmt: WeightFormat, shape: tuple[int, int]) -> tuple[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...]]]:
    """The (dtype, shape) of a quantized [N, K] matrix's `q` and `scales` arrays as stored in a
    safetensors file (the quant cache's `name.q` / `name.scales`, a GGUF's carried blocks)."""
    n, k = shape
    if fmt.name == "int8":
        return ("I8", (n, k)), ("F16", (n, k // fmt.group))
    if fmt.min8:
        return ("U8", (n, k // 2)), ("U8", (n, fmt.side_bytes(k)))
    return ("U8", (n, k // 2)), ("F16", (n, k // fmt.group, 2))


def carried_format(dtype: str) -> WeightFormat | None:
    """The quantized format a `Checkpoint.layout` dtype names (`int8-g32`, `int4-g32+min`), or None."""
    for fmt in _QUANTIZED:
        if str(fmt) == dtype:
            return fmt
    return None


def stored_format(q: tuple[str, tuple[int, ...]], scales: tuple[str, tuple[int, ...]],
                  shape: tuple[int, int]) -> WeightFormat | None:
    """The format whose stored `q` and `scales` (dtype, shape) these are for an [N, K] matrix, or None."""
    for fmt in _QUANTIZED:
        if shape[1] % fmt.group == 0 and entry_shapes(fmt, shape) == (q, scales):
            return fmt
    return None


def weights_label(fmt: WeightFormat, layout: Mapping[str, tuple[str, tuple[int, ...]]]) -> str:
    """What a run's matrices are, for the log, the statistics and a job's fingerprint: the format's
    name, except for auto and bf16, which keep a checkpoint's weights as stored: then their stored
    type(s) (`layout`: `Checkpoint.layout`), fp32 for a float32 checkpoint, `int8-g32+int4-g32+min`
    for a GGUF's carried blocks (fp32 under bf16, which dequantizes them)."""
    if fmt.name not in ("auto", "bf16"):
        return str(fmt)
    stored = dict.fromkeys(_stored_name(dtype, fmt) for dtype, shape in layout.values() if len(shape) == 2)
    return "+".join(stored) or "bf16"


def _stored_name(dtype: str, fmt: WeightFormat) -> str:
    if dtype in STORED_NAMES:
        return STORED_NAMES[dtype]
    return "fp32" if fmt.name == "bf16" else dtype  # a carried format (`int8-g32`), dequantized under bf16


@dataclass(frozen=True)
class QuantizedTensor:
    """A matrix in int8, int4 or int5 (see the module docstring for the layouts)."""

    format: WeightFormat
    q: np.ndarray  # int8 [N, K] | uint8 [N, K / 2] (int4, int5: the codes' low 4 bits)
    scales: np.ndarray  # float16 [N, K / 32] | float16 [N, K / group, 2] (scale, minimum) | min8: uint8 [N, side_bytes]

    @property
    def shape(self) -> tuple[int, int]:
        n, width = self.q.shape
        return (n, width if self.format.name == "int8" else width * 2)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes

    def dequantize(self, rows: slice | np.ndarray = slice(None), out: np.ndarray | None = None) -> np.ndarray:
        """float32 [n, K] of the rows `rows` (a slice or row indices): what the kernels compute
        with, one block of rows at a time; into `out` ([n, K] float32) when given."""
        q, fmt, k = self.q[rows], self.format, self.shape[1]
        n, group = q.shape[0], fmt.group
        values = np.empty((n, k), np.float32) if out is None else out
        grouped = values.reshape(n, k // group, group)
        if fmt.name == "int8":  # (a cast copy, then the scales in place: 1.8x one mixed-type multiply)
            values[...] = q
            grouped *= self.scales[rows].astype(np.float32)[..., None]
            return values
        pairs = q.astype("<u2")  # a byte's two codes, low nibble first, into a little-endian uint16's two bytes
        pairs = (pairs & 0xF) | ((pairs & 0xF0) << 4)  # (one contiguous cast after: 15% faster than two strided ones)
        codes = pairs.view(np.uint8).reshape(n, k)
        scales, at = self.scales[rows], fmt.pairs_at(k)
        if fmt.name == "int5":  # the fifth bits joined as bytes, before the one cast
            codes |= _FIFTH_BITS[scales[:, STEPS_BYTES:at]].view(np.uint8).reshape(n, k)
        values[...] = codes
        if not fmt.min8:
            pairs = scales.astype(np.float32)
            grouped *= pairs[..., 0, None]
            grouped += pairs[..., 1, None]
            return values
        steps = np.ascontiguousarray(scales[:, :STEPS_BYTES]).view("<f2").astype(np.float32)  # [n, 2]: ds, dm
        pair = scales[:, at : at + 2 * (k // group)].reshape(n, k // group, 2)
        grouped *= (pair[..., 0] * steps[:, :1])[..., None]
        grouped += (pair[..., 1].view(np.int8) * steps[:, 1:])[..., None]
        return values


def quantize(w: np.ndarray, fmt: WeightFormat, channel_weights: np.ndarray | None = None) -> QuantizedTensor:
    """Quantize the float32 matrix w [N, K] to `fmt` (int8, int4 or int5). int4 and int5 fit each
    group's grid to its squared error weighted by `channel_weights` [K] where given (each input
    channel's mean square over a calibration text, `quantize.calibration`), else unweighted."""
    w = np.asarray(w, np.float32)
    if fmt.name not in CODE_BITS:
        raise ValueError(f"{fmt} is not a quantized format")
    n, k = w.shape
    groups = w.reshape(n, k // fmt.group, fmt.group)
    if fmt.name == "int8":
        scales = fp16_round(np.abs(groups).max(axis=2) / np.float32(127.0))
        q = np.clip(np.rint(groups / nonzero(scales)[..., None]), -127, 127).astype(np.int8)
        return QuantizedTensor(fmt, q.reshape(n, k), scales.astype(np.float16))
    weights = None if channel_weights is None else group_weights(channel_weights, fmt.group)
    levels = fmt.grid_levels
    scale, low = fit_grid(groups, weights, levels)
    if fmt.min8:  # fitted again on the 8-bit grids of the row's steps, which the fp16 fit sets
        ds, dm = row_steps(scale, low)
        scale, low = fit_grid(groups, weights, levels, on_steps(ds, 0, SCALE_CODES), on_steps(dm, -MIN_CODES, MIN_CODES))
    codes = grid_codes(groups, scale, low, levels).astype(np.uint8).reshape(n, k)
    packed = (codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)
    if not fmt.min8:
        return QuantizedTensor(fmt, packed, np.stack([scale, low], axis=-1).astype(np.float16))
    side, at = np.zeros((n, fmt.side_bytes(k)), np.uint8), fmt.pairs_at(k)
    side[:, :STEPS_BYTES] = np.concatenate([ds, dm], axis=1).astype("<f2").view(np.uint8)
    if fmt.name == "int5":
        side[:, STEPS_BYTES:at] = np.packbits(codes >> 4, axis=1, bitorder="little")
    multiples = np.stack([np.rint(scale / nonzero(ds)), np.rint(low / nonzero(dm))], axis=-1)  # [N, G, 2], exact
    side[:, at : at + 2 * (k // fmt.group)] = multiples.astype(np.int16).astype(np.uint8).reshape(n, -1)  # (m8: two's complement)
    return QuantizedTensor(fmt, packed, side)


def to_fp16(w: np.ndarray) -> np.ndarray:
    """float16 copy of w, clamped into fp16's range."""
    return np.clip(np.asarray(w, np.float32), -FP16_MAX, FP16_MAX).astype(np.float16)
