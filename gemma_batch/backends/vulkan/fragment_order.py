"""fp16 weight tiles in the order of the matrix units' A fragments, where the device's order is known.

`VK_KHR_cooperative_matrix` leaves to the driver which of a 16 x 16 tile's elements each lane of
a subgroup holds, and in which component. On NVIDIA's driver `coopMatLoad` of a row-major tile
became four 4-byte loads a lane (580.159.04 on an H100). Stored in fragment order instead, a
lane's 8 components are 16 contiguous bytes: one 16-byte load, and the 4b decode step took
0.1 ms less at batch 1 and 0.2 ms less at batch 32 (docs/EXPERIMENTS.md, "Weight tiles in the matrix units' fragment order"). The values multiplied,
and so every sum, are the same either way.

The order the tiles are stored in is ORDER: lane l = 4 g + t holds rows g and g + 8, columns
2t, 2t + 1, 2t + 8 and 2t + 9, as (row g: 2t, 2t + 1), (row g: 2t + 8, 2t + 9), (row g + 8: 2t,
2t + 1), (row g + 8: 2t + 8, 2t + 9): the elements of PTX's m16n8k16 A fragment, in the order
the H100's driver (580.159.04) gives its components (read with the probe; PTX's own a0..a7 put
row g + 8 before column 2t + 8). `probe` reads the device's order with
`shaders/coop_fragment_probe.comp` and the path is on only where the two agree; embed.comp's
W_T16 lookup has the same formula. `GEMMA_BATCH_VK_FRAGMENT_LOADS=0` turns it off.

int8 weights go into the same order there ("T8", `int8_tiles`): a lane's 8 codes of a tile are one
8-byte load and its two rows' scales one word, dequantized in registers by the decode tile
(matmul_coop_direct.comp W_T8) rather than staged through shared memory; the same values, so the
same sums. `GEMMA_BATCH_VK_INT8_TILES=0` keeps int8 in rows (the staged decode tile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...switches import switched_on
from .kernels import Kernels
from .memory import Memory

if TYPE_CHECKING:
    from ...model.config import Gemma3Config

ENV = "GEMMA_BATCH_VK_FRAGMENT_LOADS"
INT8_TILES_ENV = "GEMMA_BATCH_VK_INT8_TILES"
TILE, LANES, COMPONENTS = 16, 32, 8


def _order() -> np.ndarray:
    """[256]: the row-major index (16 r + c) of the element at position 8 l + i of a stored tile."""
    lane, comp = np.divmod(np.arange(LANES * COMPONENTS), COMPONENTS)
    g, t = np.divmod(lane, 4)
    row = g + 8 * (comp // 4)
    col = 2 * t + comp % 2 + 8 * ((comp // 2) % 2)
    return row * TILE + col


ORDER = _order()


def fragment_tiles(matrix: np.ndarray) -> np.ndarray:
    """A matrix [R, K] of 1- or 2-byte values (R and K multiples of 16) as 16 x 16 tiles in fragment
    order, [R / 16, K / 16, 256]: tile (nt, kt)'s values in ORDER. ORDER keeps columns 2t and
    2t + 1 side by side, so the values are moved in pairs, in one transposed copy: rows 8 h + g and
    columns 8 a + 2 t (+ 1) go to (g, t, h, a) (about 5x faster than indexing by ORDER)."""
    rows, cols = matrix.shape
    pairs = np.ascontiguousarray(matrix).view(f"u{2 * matrix.itemsize}")  # [R, K / 2]
    by_part = pairs.reshape(rows // TILE, 2, 8, cols // TILE, 2, 4)  # (strip, h, g, kt, a, t)
    ordered = np.ascontiguousarray(by_part.transpose(0, 3, 2, 5, 1, 4))  # (strip, kt, g, t, h, a)
    return ordered.view(matrix.dtype).reshape(rows // TILE, cols // TILE, TILE * TILE)


def int8_tiles(q: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes [R, K] and their fp16 scales [R, K / 32] (model/quant.py; R a multiple of 16, K
    of 32) as the T8 layout (matmul_coop_direct.comp): the codes in 16 x 16 tiles in fragment
    order, [R / 16, K / 16, 256] bytes, where lane l = 4 g + t's 8 bytes are rows g (4) and g + 8
    (4); and per 16-row strip, g and 32-k group a word of the scales of rows g and g + 8,
    [R / 16, 8, K / 32, 2] fp16 (a g's groups in a row, as a row's scales lie in rows: a sector of
    them serves 4 stages of the prefill tiles, whose loads took 25% of the prompt tile's time
    group-major). A strip's codes and scales take the bytes its rows take in rows."""
    rows, cols = q.shape
    pairs = scales.reshape(rows // TILE, 2, TILE // 2, cols // 32).transpose(0, 2, 3, 1)
    return fragment_tiles(q), np.ascontiguousarray(pairs)


def int8_tiles_wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_INT8_TILES=0 keeps int8 weights in rows)."""
    return switched_on(INT8_TILES_ENV)


def wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_FRAGMENT_LOADS=0 turns fragment-order tiles off)."""
    return switched_on(ENV)


def read_order(kernels: Kernels, mem: Memory) -> np.ndarray:
    """What coop_fragment_probe.comp reads on the device (one with cooperative matrices): [257]
    uint32, the components per lane, then where there are 8 the row-major index of lane l's
    component i at 1 + 8 l + i."""
    tile = np.arange(TILE * TILE, dtype=np.float16)
    words = 1 + TILE * TILE
    src = mem.uploaded(tile, "fragment probe tile")
    out = mem.uploaded(np.full(words, 0xFFFFFFFF, np.uint32), "fragment probe output")
    try:
        kernels.run_direct("coop_fragment_probe", kernels.descriptor_set({0: src, 1: out}, out), {"words": words}, 1)
        got = mem.download(out).view(np.uint32)
    finally:
        mem.free(src)
        mem.free(out)
    return got


def probe(kernels: Kernels, mem: Memory) -> bool:
    """Whether the device's A fragments hold a tile's elements in ORDER."""
    got = read_order(kernels, mem)
    return int(got[0]) == COMPONENTS and np.array_equal(got[1:], ORDER)


def model_kernels(kernels: Kernels, mem: Memory, cfg: Gemma3Config) -> Kernels:
    """`kernels` (Kernels.for_model's, nothing recorded yet), or, where the device has cooperative
    matrices in ORDER and the user's switch allows, the same kernels with fragment loads on."""
    if not (kernels.dev.coopmat and wanted() and probe(kernels, mem)):
        return kernels
    kernels.close()  # only the probe's pipeline was built
    return Kernels.for_model(kernels.dev, cfg, kernels.x_lo, fragment_loads=True)
