"""Weight formats: how a run holds the matrix weights (`--weights bf16|fp16|int8|int4`).

Checkpoints are bf16 (some fp32 or fp16); bf16, the default, keeps a checkpoint's matrices as
stored (`weights_label` names what they are), and another format is made from them at load (and cached on disk,
`model.quant_cache`, which also decides that int4 keeps the embedding table in int8). Only the
matrices are converted (the attention and MLP projections and the embedding table, which is also
the tied LM head): they are all but a fraction of a percent of the bytes. Norm weights stay as
stored.

Layouts (a matrix W is [N out, K in]; every backend reads these same arrays):

* fp16: W as float16, clamped into fp16's range (a bf16 value below 2^-24 in magnitude flushes
  to zero; none of a real checkpoint's weights lies outside fp16's normal range).
* int8: `q` int8 [N, K] and `scales` float32 [N], one per output channel:
  W[n, k] ~ q[n, k] * scales[n], q = round(W / s) with s = max|W[n, :]| / 127.
* int4: `q` uint8 [N, K / 2] holding two weights per byte (even k in the low nibble, odd k in
  the high one, each stored as q + 8 in 0..15) and `scales` float16 [N, K / group]:
  W[n, k] ~ q * scales[n, k // group]. In each group the weight of largest magnitude m maps to
  -8 exactly (s = -m / 8, as llama.cpp's Q4_0), so the 16 levels are all used.

Rounding is to nearest, ties to even (numpy's `rint`), on the float32 value of W / s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

FORMATS = ("bf16", "fp16", "int8", "int4")
STORED_NAMES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}  # a checkpoint's float dtypes, as formats are named
INT4_GROUPS = (32, 64)
FP16_MAX = 65504.0


@dataclass(frozen=True)
class WeightFormat:
    """A run's weight format; `group` is the int4 group size (0 for the others)."""

    name: str = "bf16"
    group: int = 0

    @classmethod
    def parse(cls, name: str, int4_group: int = 32) -> WeightFormat:
        """The format `name` (one of FORMATS); `int4_group` applies to int4 only."""
        if name not in FORMATS:
            raise ValueError(f"unknown weight format {name!r}; choose one of {', '.join(FORMATS)}")
        if name != "int4":
            return cls(name)
        if int4_group not in INT4_GROUPS:
            raise ValueError(f"int4 group size must be one of {INT4_GROUPS}, not {int4_group}")
        return cls(name, int4_group)

    def __str__(self) -> str:
        return f"int4-g{self.group}" if self.name == "int4" else self.name

    def converts(self, shape: tuple[int, ...]) -> bool:
        """Whether this format changes a tensor of `shape` (a matrix, for any format but bf16)."""
        return self.name != "bf16" and len(shape) == 2

    def matrix_bytes(self, shape: tuple[int, int]) -> int:
        """Bytes a [N, K] matrix takes in this format (data and scales)."""
        n, k = shape
        if self.name == "int8":
            return n * k + 4 * n
        if self.name == "int4":
            return n * k // 2 + 2 * n * (k // self.group)
        return 2 * n * k

    def check_shape(self, tensor_name: str, shape: tuple[int, int]) -> None:
        """int4 needs K to be a whole number of groups."""
        if self.name == "int4" and shape[1] % self.group:
            raise ValueError(f"{tensor_name}: {shape[1]} columns are not a multiple of the int4 group {self.group}")


def weights_label(fmt: WeightFormat, layout: Mapping[str, tuple[str, tuple[int, ...]]]) -> str:
    """What a run's matrices are, for the log and the statistics: the format's name, except for
    bf16, which keeps a checkpoint's weights as stored: then their stored type(s) (`layout`:
    `Checkpoint.layout`), fp32 for a float32 checkpoint."""
    if fmt.name != "bf16":
        return str(fmt)
    stored = dict.fromkeys(STORED_NAMES.get(dtype, dtype.lower()) for dtype, shape in layout.values() if len(shape) == 2)
    return "+".join(stored) or "bf16"


@dataclass(frozen=True)
class QuantizedTensor:
    """A matrix in int8 or int4 (see the module docstring for the layouts)."""

    format: WeightFormat
    q: np.ndarray  # int8 [N, K] | uint8 [N, K / 2]
    scales: np.ndarray  # float32 [N] | float16 [N, K / group]

    @property
    def shape(self) -> tuple[int, int]:
        n, width = self.q.shape
        return (n, width * 2 if self.format.name == "int4" else width)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes

    def dequantize(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """float32 [n, K] of the rows `rows` (a slice or row indices): what the kernels compute
        with, one block of rows at a time."""
        if self.format.name == "int8":
            return self.q[rows].astype(np.float32) * self.scales[rows, None]
        packed = self.q[rows]
        values = np.empty((packed.shape[0], packed.shape[1] * 2), np.float32)
        values[:, 0::2] = packed & 0xF
        values[:, 1::2] = packed >> 4
        values -= 8.0
        n, k = values.shape
        grouped = values.reshape(n, k // self.format.group, self.format.group)
        grouped *= self.scales[rows, :, None].astype(np.float32)
        return values


def quantize(w: np.ndarray, fmt: WeightFormat) -> QuantizedTensor:
    """Quantize the float32 matrix w [N, K] to `fmt` (int8 or int4)."""
    w = np.asarray(w, np.float32)
    if fmt.name == "int8":
        amax = np.abs(w).max(axis=1)
        scales = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
        q = np.clip(np.rint(w / scales[:, None]), -127, 127).astype(np.int8)
        return QuantizedTensor(fmt, q, scales)
    if fmt.name != "int4":
        raise ValueError(f"{fmt} is not a quantized format")
    n, k = w.shape
    groups = w.reshape(n, k // fmt.group, fmt.group)
    at = np.abs(groups).argmax(axis=2)
    extreme = np.take_along_axis(groups, at[..., None], axis=2)[..., 0]  # signed, largest magnitude
    scales = (extreme / np.float32(-8.0)).astype(np.float16)  # fp16, as stored
    s32 = scales.astype(np.float32)
    safe = np.where(s32 != 0, s32, np.float32(1.0))
    q = np.clip(np.rint(groups / safe[..., None]), -8, 7).astype(np.int16).reshape(n, k) + 8
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return QuantizedTensor(fmt, packed, scales)


def to_fp16(w: np.ndarray) -> np.ndarray:
    """float16 copy of w, clamped into fp16's range."""
    return np.clip(np.asarray(w, np.float32), -FP16_MAX, FP16_MAX).astype(np.float16)
