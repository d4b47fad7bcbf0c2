"""Random weights of a model's real shapes in any weight format, made in seconds even for the 27B.

Drawing 27e9 numbers (or quantizing them) would take minutes of host time, so a few million values
are drawn once per kind of array and tiled into one pool as long as the largest array of that
kind; every array is a contiguous slice of its pool at its own random offset (a view: no copy, no
extra memory per tensor). The arrays are those a converted checkpoint hands the backend
(`conversion.stored_entries` and `matrix_format` decide which matrices are converted and how),
drawn directly in their storage dtype:

* bf16 / fp16 matrices: values of std 0.02 (transformers' initializer range); norm weights
  (never converted) std 0.1 around zero (applied as 1 + w).
* int8: codes of std 127/3 clipped to [-127, 127], fp16 group scales around 0.02 * 3 / 127 (a
  std-0.02 group whose extreme lies at 3 std).
* int4: any bytes (every byte is a pair of codes), fp16 group scales and minimums of magnitude
  around 0.02 * 3 / 8 and either sign (so a row's values centre on zero).
* min8 (int4 and int5): any bytes for the codes; the side rows' bytes (steps, fifth bits, 8-bit
  multiples) drawn from 0..15, so that a row's fp16 steps are positive and at most 2^-11, its
  scales and minimums at most 15 of them, and a weight at most about 0.25.

The values only have to be finite and ordinary: a benchmark's speed does not depend on them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.quant import QuantizedTensor, WeightFormat, to_fp16
from ..model.conversion import converted_nbytes_by_dtype, matrix_format, stored_entries
from ..model.safetensors_file import NUMPY_DTYPES
from ..model.weights import tensor_shapes

DRAWN = 1 << 22  # values drawn per pool; the pool repeats them
OFFSETS = 1 << 20  # a pool is this much longer than its largest array, for the random offsets
MATRIX_STD, NORM_STD = 0.02, 0.1
SCALE_SPREAD = 0.25  # scales lie within +-25% of their nominal value
Pool = tuple[str, str]  # (stored dtype, part: "matrix" | "norm" | "scales" | "pairs")


def layout(cfg: Gemma3Config) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The random checkpoint as `Checkpoint.layout` gives a real one: every tensor of
    `tensor_shapes(cfg)` stored as BF16."""
    return {name: ("BF16", shape) for name, shape in tensor_shapes(cfg).items()}


def weight_bytes_by_dtype(cfg: Gemma3Config, fmt: WeightFormat = WeightFormat()) -> dict[str, int]:
    """Bytes of every weight in `fmt` by storage kind (`converted_nbytes_by_dtype`); a tied
    embedding counts once (it is also the LM head)."""
    return converted_nbytes_by_dtype(layout(cfg), fmt)


def weight_bytes(cfg: Gemma3Config, fmt: WeightFormat = WeightFormat()) -> int:
    """Bytes of every weight in `fmt`: quantized matrices' data and scales, everything else as stored."""
    return sum(weight_bytes_by_dtype(cfg, fmt).values())


def random_tensors(cfg: Gemma3Config, seed: int = 0,
                   fmt: WeightFormat = WeightFormat()) -> Iterator[tuple[str, Tensor | QuantizedTensor]]:
    """Every tensor of `tensor_shapes(cfg)` in the order a checkpoint would stream them, as
    `quant_cache.load_converted` would hand them to `Backend.load_weights` in `fmt`: a
    QuantizedTensor for an int8 / int4 matrix, else a Tensor (F16 for an fp16 matrix, BF16 else).
    Raises ValueError when a matrix's columns are not a whole number of int4 groups."""
    stored = layout(cfg)
    entries = {name: stored_entries(name, dtype, shape, fmt) for name, (dtype, shape) in stored.items()}
    longest: dict[Pool, int] = {}
    for entry, dtype, shape in (e for es in entries.values() for e in es):
        key = (dtype, _part(entry, shape))
        longest[key] = max(longest.get(key, 0), int(np.prod(shape)))
    rng = np.random.default_rng(seed)
    pools = {key: _pool(rng, key, n + OFFSETS) for key, n in longest.items()}
    for name, tensor_entries in entries.items():
        arrays = {entry: _take(rng, pools[dtype, _part(entry, shape)], shape) for entry, dtype, shape in tensor_entries}
        if f"{name}.q" in arrays:
            yield name, QuantizedTensor(matrix_format(name, fmt, stored[name][1][1]), arrays[f"{name}.q"], arrays[f"{name}.scales"])
        else:
            yield name, Tensor(tensor_entries[0][1], arrays[name])


def _part(entry: str, shape: tuple[int, ...]) -> str:
    """Which pool an array of a stored entry comes from, besides its dtype."""
    if entry.endswith(".scales"):
        return "pairs" if len(shape) == 3 else "scales"  # int4's (scale, minimum) | int8's scales
    return "norm" if len(shape) == 1 else "matrix"


def _pool(rng: np.random.Generator, key: Pool, length: int) -> np.ndarray:
    """[length] values of `key`'s dtype (BF16 as its bits), DRAWN of them repeated; read-only."""
    pool = np.resize(_draw(rng, key, min(DRAWN, length)), length)
    pool.flags.writeable = False
    return pool


def _draw(rng: np.random.Generator, key: Pool, n: int) -> np.ndarray:
    """n values of the pool `key` (see the module docstring)."""
    dtype, part = key
    if dtype == "U8":  # int4: two codes a byte, every byte a valid pair; min8's side rows: bytes of 0..15
        return rng.integers(0, 16 if part == "scales" else 256, n, dtype=np.uint8)
    x = rng.standard_normal(n, dtype=np.float32)
    if part in ("scales", "pairs"):
        nominal = np.float32(MATRIX_STD * 3 / (127 if part == "scales" else 8)) * (1 + np.float32(SCALE_SPREAD) * np.tanh(x))
        sign = np.where(rng.random(n) < 0.5, np.float32(-1.0), np.float32(1.0)) if part == "pairs" else np.float32(1.0)
        return (nominal * sign).astype(NUMPY_DTYPES[dtype])
    if dtype == "I8":
        return np.clip(np.rint(x * np.float32(127 / 3)), -127, 127).astype(np.int8)
    x *= np.float32(NORM_STD if part == "norm" else MATRIX_STD)
    if dtype == "F16":
        return to_fp16(x)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # BF16: float32 truncated


def _take(rng: np.random.Generator, pool: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A view of `pool`: `shape`'s many values from a random offset."""
    n = int(np.prod(shape))
    start = int(rng.integers(0, pool.size - n + 1))
    return pool[start : start + n].reshape(shape)

