"""A step's rows in parts on the CPU backend's threads, and quantized matrices widened once for
the parts that multiply by them at the same time, rather than once by each part: at 8 threads each
had widened every matrix itself, 8 times the work (docs/EXPERIMENTS.md, "Quantized matrices
widened once a step on the CPU").

Each thread asks for the same matrices in the same order (a layer's products); the first to ask
for one starts widening it, in shares of SHARE_ROWS rows that every thread arriving takes from, and
each waits only until the last share is done: a slow thread finds the matrix ready, a fast one
runs ahead. Two buffers of the largest matrix take turns, so a thread two matrices ahead of the
slowest waits for it (the buffer it would fill is still being read).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.quant import QuantizedTensor

SHARE_ROWS = 256  # rows of a matrix one thread widens at a time
ROW_TILE = 16  # rows per weight product (cpu_math.matmul_rows): a fixed shape keeps BLAS on one code path


@dataclass(eq=False)
class _Widened:
    values: np.ndarray  # float32 [N, K]
    shares: list[slice]
    taken: int = 0
    done: int = 0


class SharedWidening:
    """The widened matrices of one phase of a step (the threads' parts run together)."""

    def __init__(self, threads: int, buffers: list[np.ndarray]) -> None:
        """`buffers`: two flat float32 arrays, each as large as the largest matrix asked for."""
        self.threads, self.buffers = threads, buffers
        self.changed = threading.Condition()
        self.asked = [0] * threads  # matrices each thread has asked for so far
        self.arrived: dict[int, int] = {}  # matrix index -> threads that have asked for it
        self.matrices: dict[int, _Widened] = {}
        self.broken = False

    def matrix(self, thread: int, w: QuantizedTensor) -> np.ndarray:
        """float32 [N, K]: w widened, by the threads that ask for it. `thread`: the caller's part
        index; asking for a matrix says the caller is done with the one before."""
        index = self.asked[thread]
        self.asked[thread] += 1
        with self.changed:
            self.arrived[index] = self.arrived.get(index, 0) + 1
            self.changed.notify_all()
            if index not in self.matrices:  # its buffer was matrix index - 2's: every thread past it
                self._wait(lambda: index in self.matrices or index < 2 or self.arrived.get(index - 1, 0) == self.threads)
            if index not in self.matrices:
                N, K = w.shape
                values = self.buffers[index % 2][: N * K].reshape(N, K)
                self.matrices[index] = _Widened(values, [slice(r, min(r + SHARE_ROWS, N)) for r in range(0, N, SHARE_ROWS)])
            widened = self.matrices[index]
        while True:
            with self.changed:
                if widened.taken == len(widened.shares):
                    break
                share = widened.shares[widened.taken]
                widened.taken += 1
            w.dequantize(share, out=widened.values[share])
            with self.changed:
                widened.done += 1
                self.changed.notify_all()
        with self.changed:
            self._wait(lambda: widened.done == len(widened.shares))
        return widened.values

    def abort(self) -> None:
        """A thread failed: the others stop waiting for it (BrokenBarrierError)."""
        with self.changed:
            self.broken = True
            self.changed.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> None:
        self.changed.wait_for(lambda: ready() or self.broken)
        if self.broken:
            raise threading.BrokenBarrierError("another part of the step failed")


def row_parts(rows: int, threads: int, buffers: list[np.ndarray]) -> tuple[list[slice], SharedWidening | None]:
    """A step's `rows` cut at ROW_TILE boundaries into a part per thread, or one part for a step
    of fewer tiles than threads: its products' blocks, and its attention a tile at a time, take
    all the threads instead (a part a tile kept only as many threads busy as tiles: 32-row decode
    steps on 8 threads ran 13-30% faster as one part, docs/EXPERIMENTS.md, "The CPU step budget");
    and the parts' SharedWidening where there are several and `buffers` (none: no quantized
    matrices)."""
    tiles = -(-rows // ROW_TILE)
    count = threads if tiles >= threads else 1
    ends = [min(rows, ROW_TILE * (tiles * i // count)) for i in range(count + 1)]
    parts = [slice(a, b) for a, b in zip(ends, ends[1:])]
    return parts, SharedWidening(count, buffers) if count > 1 and buffers else None


def on_parts(pool: ThreadPoolExecutor, shared: SharedWidening | None, work: Callable[..., Any],
             *args: Iterable) -> list:
    """[work(*a) for a in zip(*args)] on the pool's threads, one a step's row part, all at once.
    A part that fails stops the others' waits for it, and its own error is the one raised."""
    def run(*part_args: Any) -> Any:
        try:
            return work(*part_args)
        except BaseException:
            if shared is not None:
                shared.abort()
            raise

    futures = [pool.submit(run, *part_args) for part_args in zip(*args)]
    errors = [f.exception() for f in futures]
    if any(errors):
        raise next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                   next(e for e in errors if e is not None))
    return [f.result() for f in futures]
