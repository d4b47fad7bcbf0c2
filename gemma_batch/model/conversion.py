"""How each checkpoint tensor is converted into a run's weight format (`model.quant`'s layouts),
and what the converted tensors take: bytes by storage kind, bits a weight.

    out = convert(name, tensor, WeightFormat.parse("int4"), channel_weights)

Only matrices are converted (int4 keeps the embedding table int8: `matrix_format`); a GGUF's
carried blocks stay as they are where the format asked is theirs. `quant_cache` streams a
checkpoint through `convert` and caches the result.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .checkpoint import Tensor, to_float32
from .quant import QuantizedTensor, WeightFormat, carried_format, entry_shapes, quantize, to_fp16
from .safetensors_file import DTYPE_SIZES

# min8 (`--weights int4`): the matrices given 5-bit codes, and their group, the first of these that
# divides the columns (quant.py's docstring)
INT5_GROUPS = {"q_proj.weight": (64,), "k_proj.weight": (64,), "v_proj.weight": (64,), "gate_proj.weight": (128, 64),
               "up_proj.weight": (128, 64)}
CONVERT_ROWS = 512  # rows converted at a time, a block a thread: a 27B embedding table is 5.6 GB as float32
CONVERT_THREADS = min(8, os.cpu_count() or 1)
Loaded = Tensor | QuantizedTensor


def matrix_format(name: str, fmt: WeightFormat, columns: int) -> WeightFormat:
    """The format a matrix of `columns` inputs gets under `fmt`. int4 keeps the embedding table
    (the tied LM head) in int8, which on the demo model keeps top-1 agreement at 93% instead of
    91%. Its min8 layout (`--weights int4`) gives the matrices the block's normalised hidden state
    feeds (q/k/v, gate/up) 5-bit codes in the groups of INT5_GROUPS, where their columns are whole
    groups; o and down keep 4-bit codes in groups of 32. On the real 270M: 4.98 bits a weight,
    +2.9-4.7% perplexity rather than +8-10% at 5.0 (docs/EXPERIMENTS.md, "5-bit codes where the
    hidden state feeds": o in groups of 64 cost 1-2 points; gate/up in groups of 64 take 5.03 bits)."""
    if fmt.name == "int4" and name in ("embed_tokens.weight", "lm_head.weight"):
        return WeightFormat.parse("int8")
    if fmt.min8:
        groups = next((g for suffix, g in INT5_GROUPS.items() if name.endswith(suffix)), ())
        group = next((g for g in groups if columns % g == 0), 0)
        if group:
            return WeightFormat("int5", group, min8=True)
    return fmt


def convert(name: str, tensor: Loaded, fmt: WeightFormat, channel_weights: np.ndarray | None = None) -> Loaded:
    """One checkpoint tensor in format `fmt`, converted CONVERT_ROWS rows at a time, on threads (a
    4b took 6 minutes to int4 on one). A quantized one (a GGUF's carried blocks) stays as it is
    under auto or when it is in the format asked, else is dequantized first (bf16: to float32).
    `channel_weights` [K]: what int4's rounding weighs the input channels by (`quant.quantize`)."""
    if isinstance(tensor, QuantizedTensor):
        if fmt.name == "auto" or matrix_format(name, fmt, tensor.shape[1]) == tensor.format:
            return tensor
        rows = range(0, tensor.shape[0], CONVERT_ROWS)
        if fmt.name == "bf16":  # (into one array: a concatenation's copy took as long as the dequantizing)
            values = np.empty(tensor.shape, np.float32)
            for r in rows:
                tensor.dequantize(slice(r, r + CONVERT_ROWS), out=values[r : r + CONVERT_ROWS])
            return Tensor("F32", values)
        blocks = (tensor.dequantize(slice(r, r + CONVERT_ROWS)) for r in rows)
    else:
        if not fmt.converts(tensor.data.shape):
            return tensor
        rows = range(0, tensor.data.shape[0], CONVERT_ROWS)
        # One block in float32 at a time: each is converted before the next is widened.
        blocks = (to_float32(Tensor(tensor.dtype, tensor.data[r : r + CONVERT_ROWS])) for r in rows)
    shape = tensor.shape if isinstance(tensor, QuantizedTensor) else tensor.data.shape
    mfmt = matrix_format(name, fmt, shape[1])
    mfmt.check_shape(name, shape)
    if mfmt.name == "fp16":
        return Tensor("F16", np.concatenate([to_fp16(b) for b in blocks]))
    weights = channel_weights if mfmt.grid_levels else None
    parts = _on_threads(lambda block: quantize(block, mfmt, weights), blocks)
    return QuantizedTensor(mfmt, np.concatenate([p.q for p in parts]), np.concatenate([p.scales for p in parts]))


def _on_threads(fn: Callable[[np.ndarray], QuantizedTensor], blocks: Iterator[np.ndarray]) -> list[QuantizedTensor]:
    """fn of each block, in order, on CONVERT_THREADS threads, with at most twice that many
    blocks read ahead (a block is widened to float32 only when its turn nears)."""
    out: list[QuantizedTensor] = []
    with ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="gemma-batch-convert") as pool:
        pending: deque = deque()
        for block in blocks:
            pending.append(pool.submit(fn, block))
            if len(pending) >= 2 * CONVERT_THREADS:
                out.append(pending.popleft().result())
        out.extend(f.result() for f in pending)
    return out


def stored_entries(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> list[tuple[str, str, tuple[int, ...]]]:
    """The cache file's (name, dtype, shape) entries for one checkpoint tensor of stored `dtype`
    (a carried format's name for a quantized matrix: `Checkpoint.layout`). Raises ValueError when
    the tensor cannot take the format (`WeightFormat.check_shape`)."""
    fmt_out = _target(name, dtype, shape, fmt)
    if fmt_out is None:
        return [(name, dtype, shape)]
    if fmt_out.name in ("fp16", "bf16"):
        return [(name, "F16" if fmt_out.name == "fp16" else "F32", shape)]
    fmt_out.check_shape(name, shape)
    (q_dtype, q_shape), (s_dtype, s_shape) = entry_shapes(fmt_out, shape)
    return [(f"{name}.q", q_dtype, q_shape), (f"{name}.scales", s_dtype, s_shape)]


def _converted_format(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> WeightFormat | None:
    """The format a tensor stored as `dtype` ends in under `fmt` (bf16: dequantized to float32),
    or None where it stays as stored."""
    carried = dtype not in DTYPE_SIZES
    if not carried:
        return matrix_format(name, fmt, shape[-1]) if fmt.converts(shape) else None
    if fmt.name == "auto" or str(matrix_format(name, fmt, shape[-1])) == dtype:
        return None
    return matrix_format(name, fmt, shape[-1])


def _target(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> WeightFormat | None:
    """The format a tensor is held in under `fmt`, converted or carried as stored; None for a float
    tensor kept as stored."""
    return _converted_format(name, dtype, shape, fmt) or carried_format(dtype)


def converted_nbytes_by_dtype(layout: Mapping[str, tuple[str, tuple[int, ...]]], fmt: WeightFormat) -> dict[str, int]:
    """Bytes the tensors of `layout` (name -> stored dtype and shape, `Checkpoint.layout`) take in
    `fmt`, by storage kind: BF16 / F16 / F32, and INT8 / INT4 / INT5 for quantized matrices (data and
    scales), for `Backend.weight_bytes`."""
    out: dict[str, int] = {}
    for name, (dtype, shape) in layout.items():
        kind, nbytes = _converted_nbytes(name, dtype, shape, fmt)
        out[kind] = out.get(kind, 0) + nbytes
    return out


def matrix_bits(layout: Mapping[str, tuple[str, tuple[int, ...]]], fmt: WeightFormat) -> str:
    """Bits a weight, scales included, of the layers' matrices and of the other matrices (the
    embedding table, an untied LM head) in `fmt`: "5.00 bits a weight in the layers' matrices, 8.50
    in the embedding"."""
    sums = {True: [0, 0], False: [0, 0]}  # in a layer? -> [bits, weights]
    for name, (dtype, shape) in layout.items():
        if len(shape) == 2:
            total = sums[name.startswith("layers.")]
            total[0] += 8 * _converted_nbytes(name, dtype, shape, fmt)[1]
            total[1] += int(np.prod(shape))
    (lb, lw), (eb, ew) = sums[True], sums[False]
    return f"{lb / max(lw, 1):.2f} bits a weight in the layers' matrices, {eb / max(ew, 1):.2f} in the embedding"


def _converted_nbytes(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> tuple[str, int]:
    """The storage kind (`converted_nbytes_by_dtype`'s) and bytes of one tensor in `fmt`."""
    target = _target(name, dtype, shape, fmt)
    if target is None:
        return dtype, int(np.prod(shape)) * DTYPE_SIZES[dtype]
    if target.name == "bf16":
        return "F32", 4 * int(np.prod(shape))
    return "F16" if target.name == "fp16" else target.name.upper(), target.matrix_bytes(shape)
