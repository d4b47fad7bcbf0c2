"""A scan of a checkpoint's values for what no trained Gemma holds: NaN, infinities, and
magnitudes beyond fp16's range (65504), which the GPU's fp16 tiles cannot hold either.

Safetensors files carry no checksums, so a file damaged inside a tensor (size unchanged) loads
without complaint and shows only as NaN logits. `gemma-batch inspect --verify` runs this scan,
and a job whose logits go non-finite runs it to name the tensor at fault.

    for problem in scan(checkpoint):     # reads every tensor once, SCAN_ROWS rows at a time
        print(problem.describe())
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .checkpoint import Checkpoint, to_float32, Tensor
from .quant import FP16_MAX

SCAN_ROWS = 4096  # rows widened to float32 at a time (a 27B embedding table is 5.6 GB as float32)


@dataclass(frozen=True)
class TensorProblem:
    """A tensor holding values out of bounds: how many of each kind, and the largest finite one."""

    name: str  # canonical name (model/weights.py)
    where: str  # its name in the file, and the file
    non_finite: int  # NaN or infinite values
    beyond_fp16: int  # finite values of magnitude above 65504
    largest: float  # the largest finite magnitude

    def describe(self) -> str:
        kinds = [f"{self.non_finite:,} NaN or infinite value(s)"] if self.non_finite else []
        if self.beyond_fp16:
            kinds.append(f"{self.beyond_fp16:,} value(s) beyond fp16's range (largest {self.largest:.3g})")
        return f"{self.name} ({self.where}): {' and '.join(kinds)}"


def scan(checkpoint: Checkpoint, progress: Callable[[str], None] = lambda name: None) -> Iterator[TensorProblem]:
    """The tensors of `checkpoint` that hold out-of-bounds values, in load order; `progress` is
    called with each tensor's name before it is read."""
    for name, tensor in checkpoint.tensors():
        progress(name)
        data = tensor.data.reshape(tensor.data.shape[0], -1) if tensor.data.ndim else tensor.data.reshape(1, 1)
        non_finite = beyond = 0
        largest = 0.0
        for start in range(0, data.shape[0], SCAN_ROWS):
            values = np.abs(to_float32(Tensor(tensor.dtype, data[start : start + SCAN_ROWS])))
            finite = np.isfinite(values)
            non_finite += int(values.size - np.count_nonzero(finite))
            kept = values[finite]
            beyond += int(np.count_nonzero(kept > FP16_MAX))
            largest = max(largest, float(kept.max(initial=0.0)))
        if non_finite or beyond:
            yield TensorProblem(name, checkpoint.where(name), non_finite, beyond, largest)
