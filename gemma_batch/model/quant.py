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
* int4: `q` uint8 [N, K / 2] holding two codes per byte (even k in the low nibble, odd k in the
  high one), each in 0..15, and `scales` float16 [N, K / group, 2], a scale and a minimum per group
  (llama.cpp's Q4_1 / Q4_K idea): W[n, k] ~ q * scales[n, g, 0] + scales[n, g, 1], g = k // group.
  The grid starts at the group's min and max, then its scale and minimum are refitted by least
  squares to the codes they give, INT4_REFITS times, each kept where it lowers the group's squared
  error. That error weighs each weight by its input channel's mean square over a calibration text
  where the run has one (`quantize/calibration.py`; llama.cpp's "importance matrix"): on the real
  270M, +9% perplexity rather than +27%. 5.0 bits a weight in groups of 32, 4.5 in groups of 64.

Rounding is to nearest, ties to even (numpy's `rint`), on the float32 value of W / s (int4:
(W - minimum) / s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

FORMATS = ("auto", "bf16", "fp16", "int8", "int4")
FORMATS_HELP = ("Weight format: auto (as stored: a GGUF in its own quantization, a float32 checkpoint fp32), bf16 (as "
                "stored, a GGUF's blocks dequantized), fp16, int8 (a scale per 32 weights) or int4 (a scale and a minimum "
                "per --int4-group weights, calibrated; the embedding int8).")
STORED_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}  # a checkpoint's float dtypes, as formats are named
INT4_GROUPS = (32, 64)
INT8_GROUP = 32  # int8 weights per scale
INT4_REFITS = 4  # least-squares refits of an int4 group's scale and minimum
FP16_MAX = 65504.0


@dataclass(frozen=True)
class WeightFormat:
    """A run's weight format; `group` is the weights per scale of int8 (INT8_GROUP) and int4 (0
    for the others)."""

    name: str = "bf16"
    group: int = 0

    @classmethod
    def parse(cls, name: str, int4_group: int = 32) -> WeightFormat:
        """The format `name` (one of FORMATS); `int4_group` applies to int4 only."""
        if name not in FORMATS:
            raise ValueError(f"unknown weight format {name!r}; choose one of {', '.join(FORMATS)}")
        if name == "int8":
            return cls(name, INT8_GROUP)
        if name != "int4":
            return cls(name)
        if int4_group not in INT4_GROUPS:
            raise ValueError(f"int4 group size must be one of {INT4_GROUPS}, not {int4_group}")
        return cls(name, int4_group)

    def __str__(self) -> str:
        """The format with its grain: int8-g32, int4-g32+min (a minimum beside each scale)."""
        if self.name == "int8":
            return f"int8-g{self.group}"
        return f"int4-g{self.group}+min" if self.name == "int4" else self.name

    def converts(self, shape: tuple[int, ...]) -> bool:
        """Whether this format changes a float tensor of `shape` (a matrix, for any format but auto and bf16)."""
        return self.name not in ("auto", "bf16") and len(shape) == 2

    def matrix_bytes(self, shape: tuple[int, int]) -> int:
        """Bytes a [N, K] matrix takes in this format (data and scales)."""
        n, k = shape
        if self.name == "int8":
            return n * k + 2 * n * (k // self.group)
        if self.name == "int4":
            return n * k // 2 + 4 * n * (k // self.group)
        return 2 * n * k

    def check_shape(self, tensor_name: str, shape: tuple[int, int]) -> None:
        """int8 and int4 need K to be a whole number of groups."""
        if self.group and shape[1] % self.group:
            raise ValueError(f"{tensor_name}: {shape[1]} columns are not a multiple of the {self.name} group {self.group}")


_QUANTIZED = (WeightFormat.parse("int8"), *(WeightFormat.parse("int4", g) for g in INT4_GROUPS))


def entry_shapes(fmt: WeightFormat, shape: tuple[int, int]) -> tuple[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...]]]:
    """The (dtype, shape) of a quantized [N, K] matrix's `q` and `scales` arrays as stored in a
    safetensors file (the quant cache's `name.q` / `name.scales`, a GGUF's carried blocks)."""
    n, k = shape
    if fmt.name == "int8":
        return ("I8", (n, k)), ("F16", (n, k // fmt.group))
    return ("U8", (n, k // 2)), ("F16", (n, k // fmt.group, 2))


def carried_format(dtype: str) -> WeightFormat | None:
    """The quantized format a `Checkpoint.layout` dtype names (`int8-g32`, `int4-g64+min`), or None."""
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
    """A matrix in int8 or int4 (see the module docstring for the layouts)."""

    format: WeightFormat
    q: np.ndarray  # int8 [N, K] | uint8 [N, K / 2]
    scales: np.ndarray  # float16 [N, K / 32] | float16 [N, K / group, 2] (scale, minimum)

    @property
    def shape(self) -> tuple[int, int]:
        n, width = self.q.shape
        return (n, width * 2 if self.format.name == "int4" else width)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes

    def dequantize(self, rows: slice | np.ndarray = slice(None), out: np.ndarray | None = None) -> np.ndarray:
        """float32 [n, K] of the rows `rows` (a slice or row indices): what the kernels compute
        with, one block of rows at a time; into `out` ([n, K] float32) when given."""
        q, scales = self.q[rows], self.scales[rows].astype(np.float32)
        n, group = q.shape[0], self.format.group
        k = self.shape[1]
        values = np.empty((n, k), np.float32) if out is None else out
        grouped = values.reshape(n, k // group, group)
        if self.format.name == "int8":  # (a cast copy, then the scales in place: 1.8x one mixed-type multiply)
            values[...] = q
            grouped *= scales[..., None]
            return values
        pairs = q.astype("<u2")  # a byte's two codes, low nibble first, into a little-endian uint16's two bytes
        pairs = (pairs & 0xF) | ((pairs & 0xF0) << 4)  # (one contiguous cast after: 15% faster than two strided ones)
        values[...] = pairs.view(np.uint8).reshape(n, k)
        grouped *= scales[..., 0, None]
        grouped += scales[..., 1, None]
        return values


def quantize(w: np.ndarray, fmt: WeightFormat, channel_weights: np.ndarray | None = None) -> QuantizedTensor:
    """Quantize the float32 matrix w [N, K] to `fmt` (int8 or int4). int4 fits each group's grid
    to its squared error weighted by `channel_weights` [K] where given (each input channel's mean
    square over a calibration text, `quantize.calibration`), else unweighted."""
    w = np.asarray(w, np.float32)
    if fmt.name not in ("int8", "int4"):
        raise ValueError(f"{fmt} is not a quantized format")
    n, k = w.shape
    groups = w.reshape(n, k // fmt.group, fmt.group)
    if fmt.name == "int8":
        scales = _fp16(np.abs(groups).max(axis=2) / np.float32(127.0))
        q = np.clip(np.rint(groups / _nonzero(scales)[..., None]), -127, 127).astype(np.int8)
        return QuantizedTensor(fmt, q.reshape(n, k), scales.astype(np.float16))
    weights = None if channel_weights is None else _group_weights(channel_weights, fmt.group)
    scale, low = _int4_grid(groups, weights)
    q = _int4_codes(groups, scale, low).astype(np.uint8).reshape(n, k)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return QuantizedTensor(fmt, packed, np.stack([scale, low], axis=-1).astype(np.float16))


def _group_weights(channel_weights: np.ndarray, group: int) -> np.ndarray:
    """[1, K / group, group] float32: the weights over each group divided by the group's largest
    (a group's fit does not change with their scale; this keeps its sums in float32's range), a
    zero weight raised to 1e-6 of it (a channel the text never used still counts a little)."""
    d = np.asarray(channel_weights, np.float32).reshape(1, -1, group)
    top = d.max(axis=2, keepdims=True)
    d = d / np.where(top > 0, top, np.float32(1.0))
    return np.where(top > 0, np.maximum(d, np.float32(1e-6)), np.float32(1.0))


def _fp16(x: np.ndarray) -> np.ndarray:
    """x rounded to fp16 (clamped into its range), as float32."""
    return np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16).astype(np.float32)


def _nonzero(s: np.ndarray) -> np.ndarray:
    """s with zeros replaced by 1 (a group of zeros, or of values too small for an fp16 scale, codes 0)."""
    return np.where(s != 0, s, np.float32(1.0))


def _int4_codes(groups: np.ndarray, scale: np.ndarray, low: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((groups - low[..., None]) / _nonzero(scale)[..., None]), 0, 15)


def _int4_grid(groups: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each group's fp16 scale and minimum (as float32 [N, G]): from its min and max, then refitted
    by least squares to the codes they give, each weight's error weighted by `weights` (broadcast
    to `groups`; None: all 1), a refit kept where it lowers that error (module docstring).
    Unweighted on the real 270M's layers this takes the squared error from 0.58% of the weights'
    to 0.47%, as much as a 9 x 9 search of the grid's ends, at a tenth of its time."""
    d = np.ones_like(groups[:1]) if weights is None else weights
    lo, hi = groups.min(axis=2), groups.max(axis=2)
    scale, low = _fp16((hi - lo) / np.float32(15.0)), _fp16(lo)
    codes = _int4_codes(groups, scale, low)
    error = (d * (codes * scale[..., None] + low[..., None] - groups) ** 2).sum(axis=2)
    size = d.sum(axis=2)
    dw = d * groups
    sw = dw.sum(axis=2)
    for _ in range(INT4_REFITS):
        dq = d * codes
        sq, sqq, sqw = dq.sum(axis=2), (dq * codes).sum(axis=2), (dq * groups).sum(axis=2)
        det = size * sqq - sq * sq
        fits = det > 0
        det = np.where(fits, det, np.float32(1.0))
        new_scale = _fp16(np.where(fits, (size * sqw - sq * sw) / det, scale))
        new_low = _fp16(np.where(fits, (sqq * sw - sq * sqw) / det, low))
        new_codes = _int4_codes(groups, new_scale, new_low)
        new_error = (d * (new_codes * new_scale[..., None] + new_low[..., None] - groups) ** 2).sum(axis=2)
        better = new_error < error
        scale, low, error = np.where(better, new_scale, scale), np.where(better, new_low, low), np.minimum(new_error, error)
        codes = np.where(better[..., None], new_codes, codes)
    return scale, low


def to_fp16(w: np.ndarray) -> np.ndarray:
    """float16 copy of w, clamped into fp16's range."""
    return np.clip(np.asarray(w, np.float32), -FP16_MAX, FP16_MAX).astype(np.float16)
