"""The CPU backend's arithmetic: batch-invariant weight products and Gemma's elementwise pieces,
in numpy float32 (`cpu.py` says why the products run in fixed tiles).

Shapes: T tokens, H hidden, hd head dim, V vocab.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from queue import SimpleQueue

import numpy as np

from ..model.config import RopeSpec
from ..model.quant import QuantizedTensor
from .cpu_parts import ROW_TILE, SharedWidening

F32 = np.float32
W_ROWS = 256  # output rows of a matrix multiplied at a time (a quantized one: dequantized at a time)
LARGE_ROWS = 1024  # the same for matrices of LARGE_MATRIX output rows or more (the LM head)
LARGE_MATRIX = 1 << 14
# Every matrix is multiplied in blocks of rows that depend on its shape alone, whatever the step's
# rows and the number of threads, so each output's sum is one BLAS call of one shape in any step;
# blocks this small let a step of one tile spread even a 270M's layer matrices over the threads.
MAX_THREADS = 8
RUN_TILES = 8  # tiles a thread takes at a time from a float32 block
Matrix = np.ndarray | QuantizedTensor


def matmul_rows(x: np.ndarray, w: Matrix, pool: ThreadPoolExecutor | None = None,
                shared: tuple[SharedWidening, int] | None = None) -> np.ndarray:
    """x [T, K] @ w.T for w [N, K], in tiles of ROW_TILE rows so each row's result is batch-invariant,
    and in blocks of `block_rows(N)` output rows (a quantized matrix is dequantized a block at a
    time). With `pool`, its threads take the blocks (a float32 one in runs of RUN_TILES tiles): the same
    tiles and blocks, so the same bits, as without. With `shared` (a SharedWidening and this
    thread's part index in it), a quantized matrix is widened once for all the parts' threads."""
    return matmul_each(x, [w], pool, shared)[0]


def matmul_each(x: np.ndarray, ws: list[Matrix], pool: ThreadPoolExecutor | None = None,
                shared: tuple[SharedWidening, int] | None = None) -> list[np.ndarray]:
    """[matmul_rows(x, w, pool, shared) for w in ws], the same bits, with the blocks of all of them
    handed to the pool's threads at once: a step of one tile hands a layer's q/k/v (or gate/up)
    over once rather than once a matrix."""
    if shared is not None and len(ws) > 1:  # (each matrix widened, then multiplied, in turn: the buffers take turns)
        return [matmul_rows(x, w, None, shared) for w in ws]
    T, K = x.shape
    tiles = -(-T // ROW_TILE)
    padded = np.zeros((tiles, ROW_TILE, K), F32)
    padded.reshape(-1, K)[:T] = x
    outs, work = [], []
    for w in ws:
        N, step = w.shape[0], block_rows(w.shape[0])
        outs.append(np.empty((tiles, ROW_TILE, N), F32))
        run = RUN_TILES if pool is not None and isinstance(w, np.ndarray) else max(tiles, 1)  # (quantized: widened once)
        ready = w if isinstance(w, np.ndarray) else None if shared is None else shared[0].matrix(shared[1], w)
        spare: SimpleQueue[np.ndarray] = SimpleQueue()  # dequantized blocks' buffers, reused by the threads
        work += [(w, ready, spare, outs[-1], slice(r, r + step), slice(i, i + run))
                 for r in range(0, N, step) for i in range(0, tiles, run)]

    def product(item: tuple) -> None:
        w, ready, spare, out, rows, run = item
        if ready is not None:
            weights = ready[rows]
        else:  # quantized: made as needed, into a buffer an earlier block used (no fresh pages to fault in)
            buffer = np.empty((rows.stop - rows.start, K), F32) if spare.empty() else spare.get()
            weights = w.dequantize(rows, out=buffer[: min(rows.stop, w.shape[0]) - rows.start])
        # As w @ tile.T, one BLAS call a tile: the tile's rows are the product's columns. OpenBLAS
        # 0.3.31's small-matrix sgemm sums a row of `tile @ w.T` in an order that depends on the
        # row's place in the tile (rows 6-15 differ from row 0 on Haswell); columns of
        # `w @ tile.T` do not, up to 16 of them.
        out[run, :, rows] = np.matmul(weights, padded[run].transpose(0, 2, 1)).transpose(0, 2, 1)
        if ready is None:
            spare.put(buffer)

    if pool is None or len(work) == 1:
        for item in work:
            product(item)
    else:
        list(pool.map(product, work))
    return [out.reshape(-1, out.shape[2])[:T] for out in outs]


def block_rows(n: int) -> int:
    """The output rows of an [n, K] matrix's blocks."""
    return LARGE_ROWS if n >= LARGE_MATRIX else W_ROWS


def embed_rows(table: Matrix, token_ids: np.ndarray) -> np.ndarray:
    """float32 rows of the embedding table for `token_ids`."""
    return table[token_ids] if isinstance(table, np.ndarray) else table.dequantize(token_ids)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Gemma's RMSNorm over the last axis, with the weight applied as (1 + w): x / sqrt(mean(x^2)
    + eps) * (1 + w), the mean as np.mean computes it (a float32 sum, then the division; the same
    bits without its Python overhead, which small decode steps felt)."""
    ms = np.add.reduce(x * x, axis=-1, keepdims=True)
    ms /= F32(x.shape[-1])
    ms += F32(eps)
    return x / np.sqrt(ms, out=ms) * (F32(1.0) + w)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (torch `gelu(approximate="tanh")`, HF `gelu_pytorch_tanh`):
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in place on one temporary (the same
    operations in the same order as the expression, so the same bits, without its five temporaries)."""
    t = np.multiply(x, F32(0.044715))
    t *= x
    t *= x
    t += x
    t *= F32(np.sqrt(2.0 / np.pi))
    np.tanh(t, out=t)
    t += F32(1.0)
    t *= F32(0.5) * x
    return t


def rope_inv_freq(head_dim: int, spec: RopeSpec) -> np.ndarray:
    """[hd/2] float32: 1 / theta**(2i/hd) / factor, computed in fp32 as transformers does."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
    return (F32(1.0) / (F32(spec.theta) ** exponent)) / F32(spec.factor)


def rope_cos_sin(positions: np.ndarray, head_dim: int, spec: RopeSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [T, hd] for rotate-half RoPE; angles are the fp32 product p * inv_freq."""
    inv_freq = rope_inv_freq(head_dim, spec)  # [hd/2]
    angles = positions.astype(F32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, hd]
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, hd] rotated by position: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
