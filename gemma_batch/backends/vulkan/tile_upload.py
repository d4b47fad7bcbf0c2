"""bf16 / fp16 matrices into fp16 tiles on the device (`shaders/tiles.comp`), at load.

The host's `weights.fp16_tiles` converted about 0.6 GB of weights a second on the H200 machine's
CPU: 12.1 of a 4b job's 22.2 s of start-up. Here the rows go up as they are, a block at a time,
into a scratch buffer, and tiles.comp writes their tiles (bit for bit the host's) into the
weight buffer. A NaN or infinity is counted on the device, and the tensor refused once its
blocks are done, as fp16_bits refuses it. `GEMMA_BATCH_VK_DEVICE_TILES=0` converts on the host.
"""

from __future__ import annotations

import numpy as np

from ...startup import phase
from ...switches import switched_on
from .coopmat import TILE
from .kernels import Kernels
from .memory import Buffer, Memory

ENV = "GEMMA_BATCH_VK_DEVICE_TILES"
BLOCK_BYTES = 32 * 2**20  # source rows converted per dispatch (a dispatch of at most 32,768 workgroups)
WG = 256  # tiles.comp's workgroup size


def wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_DEVICE_TILES=0 converts on the host)."""
    return switched_on(ENV)


class TileUpload:
    """Converts matrices into tiles in device buffers; `close` frees its scratch buffers."""

    def __init__(self, kernels: Kernels, mem: Memory, fragment_order: bool) -> None:
        self.kernels, self.mem, self.fragment_order = kernels, mem, fragment_order
        self._scratch: Buffer | None = None
        self._bad = mem.alloc(4, "tile conversion: non-finite count")

    def upload(self, dst: Buffer, values: np.ndarray, bf16: bool, first_row: int, name: str) -> None:
        """Put `values` (bf16 or fp16 bits, uint16 [R, K], R and K multiples of 16) as tiles into
        `dst` from row `first_row` on (a strip of 16 rows takes the bytes of its rows). ValueError
        naming `name` for a NaN or infinity in bf16 values."""
        rows, k = values.shape
        block = max(TILE, BLOCK_BYTES // (2 * k) // TILE * TILE)
        scratch = self._scratch_for(min(rows, block) * k * 2)
        self.mem.upload(self._bad, np.zeros(1, np.uint32))
        dset = self.kernels.descriptor_set({0: scratch, 1: dst, 2: self._bad}, self._bad)
        for start in range(0, rows, block):
            piece = values[start:start + block]
            with phase("weights: upload"):
                self.mem.upload(scratch, piece)
            with phase("weights: fp16 tiles"):
                push = {"words": piece.size // 2, "K": k, "dst_word": (first_row + start) * k // 2,
                        "fragment": int(self.fragment_order), "bf16": int(bf16)}
                self.kernels.run_direct("tiles", dset, push, -(-push["words"] // WG))
        bad = int(self.mem.download(self._bad, 4).view(np.uint32)[0])
        if bad:
            raise ValueError(f"{name} holds {bad} NaN or infinite value(s): the checkpoint is damaged "
                             "(gemma-batch inspect MODEL --verify lists every such tensor)")

    def _scratch_for(self, nbytes: int) -> Buffer:
        if self._scratch is None or self._scratch.size < nbytes:
            if self._scratch is not None:
                self.mem.free(self._scratch)
            self._scratch = self.mem.alloc(nbytes, "tile conversion: source rows")
        return self._scratch

    def close(self) -> None:
        for buf in (self._scratch, self._bad):
            if buf is not None:
                self.mem.free(buf)
        self._scratch = self._bad = None
