"""Quantized matrices widened once for a step's row parts (`cpu_parts.SharedWidening`), or a block
at a time on the backend's threads (`matmul_rows` with a pool): the same bits as each part
widening its own, each weight widened once, a failing part raised, not waited on.

References: `matmul_rows` without sharing on the calling thread (itself checked against float64
products of the dequantized matrix in test_quant.py), and counts of the rows each call widens.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.backends.cpu_math import W_ROWS, matmul_each, matmul_rows
from gemma_batch.backends.cpu_parts import SharedWidening, on_parts
from gemma_batch.bench.shapes import shape_config
from gemma_batch.model.quant import QuantizedTensor, WeightFormat, quantize

rng = np.random.default_rng(0)


class Counted(QuantizedTensor):
    """A quantized matrix that counts the times each of its rows is widened."""

    def dequantize(self, rows=slice(None), out=None):
        self.widened[rows] += 1
        return super().dequantize(rows, out=out)


def counted(n: int, k: int, fmt: str) -> Counted:
    plain = quantize(rng.standard_normal((n, k)).astype(np.float32), WeightFormat.parse(fmt))
    w = Counted(plain.format, plain.q, plain.scales)
    object.__setattr__(w, "widened", np.zeros(n, np.int64))
    return w


@pytest.mark.parametrize("parts", [2, 3])
def test_parts_sharing_the_widening_get_the_bits_of_widening_alone_and_widen_each_row_once(parts):
    # Matrices of several widths and block counts, the last block short, in the order a layer
    # takes them; the second int4 matrix takes the first one's input width, as o takes q's.
    ws = [counted(2 * W_ROWS + 64, 64, "int4"), counted(96, 64, "int8"), counted(W_ROWS + 7, 2 * W_ROWS + 64, "int4")]
    x = rng.standard_normal((100, 64)).astype(np.float32)
    cuts = np.linspace(0, 100, parts + 1).astype(int)
    rows = [slice(a, b) for a, b in zip(cuts, cuts[1:])]
    shared = SharedWidening(parts, [np.empty(max(w.shape[0] * w.shape[1] for w in ws), np.float32) for _ in range(2)])

    def part(i: int) -> list[np.ndarray]:
        first, second = matmul_each(x[rows[i]], ws[:2], None, (shared, i))  # (as q/k/v take one input)
        return [first, second, matmul_rows(first, ws[2], None, (shared, i))]

    with ThreadpoolController().limit(limits=1, user_api="blas"):  # (as the backend runs its steps)
        with ThreadPoolExecutor(parts) as pool:
            together = on_parts(pool, shared, part, range(parts))
        for w in ws:
            assert (w.widened == 1).all()
        first = matmul_rows(x, ws[0])
        expected = [first, matmul_rows(x, ws[1]), matmul_rows(first, ws[2])]
    for got, want in zip(zip(*together), expected):
        assert np.array_equal(np.concatenate(got), want)


def test_a_part_that_fails_is_raised_while_the_others_wait_for_it():
    ws = [counted(W_ROWS, 64, "int8") for _ in range(3)]
    x = rng.standard_normal((48, 64)).astype(np.float32)
    shared = SharedWidening(3, [np.empty(W_ROWS * 64, np.float32) for _ in range(2)])

    def part(i: int) -> None:
        if i == 1:
            raise ValueError("part 1 broke")
        for w in ws:  # the third matrix takes the first one's buffer: it waits for every part to be past it
            matmul_rows(x[16 * i : 16 * i + 16], w, None, (shared, i))

    with ThreadPoolExecutor(3) as pool, pytest.raises(ValueError, match="part 1 broke"):
        on_parts(pool, shared, part, range(3))


def test_the_pools_blocks_widen_each_row_once_with_many_tiles():
    """One part with the backend's threads on a matrix's blocks (as the LM head of a step that
    returns every row's logits): each block widened once for all its tiles, the bits of no pool."""
    w = counted(3 * W_ROWS + 5, 64, "int8")
    x = rng.standard_normal((40 * 16 + 3, 64)).astype(np.float32)
    with ThreadpoolController().limit(limits=1, user_api="blas"), ThreadPoolExecutor(3) as pool:
        got = matmul_rows(x, w, pool)
        assert (w.widened == 1).all()
        assert np.array_equal(got, matmul_rows(x, w))


@pytest.mark.parametrize("rows", [5, 16, 40 * 16 + 3])
def test_matrices_of_one_input_handed_to_the_threads_together_give_each_ones_bits(rows):
    """`matmul_each` (a layer's q/k/v or gate/up in one hand-off) against each matrix alone."""
    ws = [rng.standard_normal((2 * W_ROWS + 64, 64)).astype(np.float32), counted(96, 64, "int8"),
          counted(W_ROWS + 7, 64, "int4")]
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    with ThreadpoolController().limit(limits=1, user_api="blas"), ThreadPoolExecutor(3) as pool:
        together = matmul_each(x, ws, pool)
        assert all((w.widened == 1).all() for w in ws[1:])
        for got, w in zip(together, ws, strict=True):
            assert np.array_equal(got, matmul_rows(x, w))


@pytest.mark.parametrize("shape, budget", [("270m", 8192), ("4b", 6144), ("27b", 3072)])
def test_a_cpu_job_takes_long_steps_within_the_activations_bytes(shape, budget):
    """The CPU's default step budget: 8,192 tokens, fewer where a step's widest activation (27b:
    [T, 21,504] float32, 252 MiB at 3,072 tokens, 294 MiB at 3,584) would pass 256 MiB."""
    assert CpuBackend(shape_config(shape), threads=1).default_step_tokens == budget
