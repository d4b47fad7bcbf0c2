"""How `shaders/attention.comp` splits a query's keys into chunks, mirrored on the host.

A query at position p sees keys [lo, p] (lo = max(0, p - window + 1) on sliding layers, else 0).
The keys are cut at multiples of a span of absolute positions: `chunk`, doubled while [lo, p]
would meet more than MAX_CHUNKS chunks (which bounds the scratch of partial results at long
contexts). The shader runs one workgroup per (chunk, token, kv head) and merges the chunks in
order; the split depends only on p and the model, never on the batch (batch invariance).

The host needs the counts twice: the most chunks of any token of a step sizes the attention grid
(`most_chunks` over the step's positions), and the most chunks any position a block table of the
capacity can hold sizes the scratch (`most_chunks` over every such position). In steps whose
(token, kv head) pairs alone fill the device (`serial_grid`), the grid has a workgroup per pair,
which takes its token's chunks one after the other: the same sums, fewer workgroups, and no
query heads made again per chunk (attention_heads.glsl).
"""

from __future__ import annotations

import numpy as np

MAX_CHUNKS = 32  # MAX_CHUNKS of shaders/attention.comp
DEFAULT_CHUNK = 64  # keys per chunk below 32 * 64 visible positions: one pass of the shader
# The serial grid where a step's (token, kv head) pairs number at least this many per SM. 4b on
# the H200 (132 SMs, 4 attention workgroups an SM), decode tok/s with the serial grid against a
# workgroup per chunk: batch 128 (512 pairs) 13,710-13,712 against 13,305-13,324, 96 (384)
# 12,762-12,766 against 12,285-12,306; forced at 64 (256) 9,944-9,965 against 9,885-9,913, at 32
# (128) 6,655-6,662 against 7,093-7,111 (docs/EXPERIMENTS.md, "A serial attention grid").
SERIAL_PAIRS_PER_SM = 2
SERIAL_ENV = "GEMMA_BATCH_VK_SERIAL_ATTENTION"  # "0": always a workgroup per chunk


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


def serial_grid(pairs: int, sm_count: int, allowed: bool = True) -> bool:
    """Whether a step of `pairs` (token, kv head) pairs on attention.comp runs its serial grid on a
    device of `sm_count` SMs (0: unknown, never) where the switch (`allowed`) lets it."""
    return allowed and sm_count > 0 and pairs >= SERIAL_PAIRS_PER_SM * sm_count
