"""How `shaders/attention.comp` splits a query's keys into chunks, mirrored on the host.

A query at position p sees keys [lo, p] (lo = max(0, p - window + 1) on sliding layers, else 0).
The keys are cut at multiples of a span of absolute positions: `chunk`, doubled while [lo, p]
would meet more than MAX_CHUNKS chunks (which bounds the scratch of partial results at long
contexts). The shader runs one workgroup per (chunk, token, kv head) and merges the chunks in
order; the split depends only on p and the model, never on the batch (batch invariance).

The host needs the counts twice: the most chunks of any token of a step sizes the attention grid
(`most_chunks` over the step's positions), and the most chunks any position a block table of the
capacity can hold sizes the scratch (`most_chunks` over every such position).
"""

from __future__ import annotations

import numpy as np

MAX_CHUNKS = 32  # MAX_CHUNKS of shaders/attention.comp
DEFAULT_CHUNK = 64  # keys per chunk below 32 * 64 visible positions: one pass of the shader


def chunk_counts(positions: np.ndarray, window: int | None, chunk: int) -> np.ndarray:
    """[n] chunks of the query at each position, for a layer of `window` (None: global)."""
    p = np.asarray(positions, np.int64)
    lo = np.zeros_like(p) if window is None else np.maximum(0, p - window + 1)
    span = np.full_like(p, chunk)
    count = p // span - lo // span + 1
    while (over := count > MAX_CHUNKS).any():
        span[over] *= 2
        count = p // span - lo // span + 1
    return count


def most_chunks(positions: np.ndarray, window: int | None, chunk: int) -> int:
    """The most chunks of any of the positions (0 for none)."""
    return int(chunk_counts(positions, window, chunk).max(initial=0))
