"""Random bf16 weights of a model's real shapes, made in seconds even for the 27B.

Drawing 27e9 normal numbers would take minutes of host time, so a few million are drawn once and
tiled into one pool as long as the largest tensor; every tensor is a contiguous slice of the pool
at its own random offset (a view: no copy, no extra memory per tensor). Matrices take values of
std 0.02 (transformers' initializer range), norm weights std 0.1 around zero (applied as 1 + w).
The values only have to be finite and ordinary: a benchmark's speed does not depend on them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.weights import tensor_shapes

DRAWN = 1 << 22  # normal values drawn; the pool repeats them
OFFSETS = 1 << 20  # the pool is this much longer than the largest tensor, for the random offsets
MATRIX_STD, NORM_STD = 0.02, 0.1
BF16_BYTES = 2


def _bf16_pool(rng: np.random.Generator, std: float, length: int) -> np.ndarray:
    """[length] uint16 bf16 bits (float32 truncated), normal of `std`, read-only."""
    drawn = rng.standard_normal(min(DRAWN, length), dtype=np.float32) * np.float32(std)
    pool = np.resize((drawn.view(np.uint32) >> 16).astype(np.uint16), length)
    pool.flags.writeable = False
    return pool


def random_tensors(cfg: Gemma3Config, seed: int = 0) -> Iterator[tuple[str, Tensor]]:
    """Every tensor of `tensor_shapes(cfg)`, as BF16, in the order a checkpoint would stream them."""
    shapes = tensor_shapes(cfg)
    rng = np.random.default_rng(seed)
    largest = max(int(np.prod(s)) for s in shapes.values())
    matrices = _bf16_pool(rng, MATRIX_STD, largest + OFFSETS)
    norms = _bf16_pool(rng, NORM_STD, max(cfg.hidden_size, cfg.head_dim) + OFFSETS)
    for name, shape in shapes.items():
        pool = norms if len(shape) == 1 else matrices
        n = int(np.prod(shape))
        start = int(rng.integers(0, pool.size - n + 1))
        yield name, Tensor("BF16", pool[start : start + n].reshape(shape))


def weight_bytes(cfg: Gemma3Config) -> int:
    """Bytes of every weight as stored in bf16; a tied embedding counts once (it is also the LM head)."""
    return BF16_BYTES * sum(int(np.prod(s)) for s in tensor_shapes(cfg).values())
