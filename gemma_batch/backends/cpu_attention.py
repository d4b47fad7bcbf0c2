"""The CPU backend's attention over its paged KV cache, batch-invariant by construction.

A query at position p sees the keys of its sequence at positions [lo, p] (lo = max(0, p - window + 1)
on sliding layers, else 0). It computes over the ATTN_BUCKET-multiple L_pad >= L of positions
ending with its own, the ones before lo masked, so its arithmetic has the shapes of L_pad alone and
its bits depend only on its own query and keys; queries of one L_pad, of any sequences, go through
numpy together (`attend`). A prompt's queries (a run of one sequence's) view their windows in its
keys read once; the same values in the same strides as copying each window. Shapes: T tokens,
nh/nkv heads of hd.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..model.config import Gemma3Config
from .base import StepBatch
from .kv_formats import KVStore

F32 = np.float32
ATTN_BUCKET = 64  # a query's keys are padded to a multiple of this
ATTN_WINDOWS = 1 << 22  # key (and value) window elements copied at once, at most (a longer run goes in parts)
RUN_MIN = 8  # a sequence with this many queries in a step reads its keys once (`attend`)


@dataclass
class AttentionPlan:
    """Which keys each query of the step sees in one KV group: keys at positions [lo, p] of its
    sequence, found through the block table."""

    seqs: np.ndarray  # [T] the sequence of each token
    positions: np.ndarray  # [T] p
    lo: np.ndarray  # [T] the first position it sees
    table: np.ndarray  # [S, max_blocks] block ids
    block_size: int

    def rows(self, rows: slice) -> AttentionPlan:
        """The plan of the step's queries `rows`."""
        return AttentionPlan(self.seqs[rows], self.positions[rows], self.lo[rows], self.table, self.block_size)


def attention_plan(batch: StepBatch, group: str, window: int | None, block_size: int) -> AttentionPlan:
    """Each query's sequence, position and first visible position; checks that the block
    table holds every position a query sees."""
    bs, table = block_size, batch.block_tables[group]
    seqs = np.repeat(np.arange(batch.num_seqs), np.diff(batch.seq_starts))
    lo = np.zeros_like(batch.positions) if window is None else np.maximum(0, batch.positions - window + 1)
    for s in range(batch.num_seqs):
        start = int(batch.seq_starts[s])
        k_pos = np.arange(int(lo[start]), int(batch.context_lens[s]))  # (the sequence's first query sees the earliest)
        blocks = table[s, k_pos // bs]
        if (blocks < 0).any():
            missing = int(k_pos[np.argmax(blocks < 0)])
            raise ValueError(f"sequence {s}: no {group} KV block holds position {missing}")
    return AttentionPlan(seqs, batch.positions.astype(np.int64), lo.astype(np.int64), table, block_size)


def attend(
    q: np.ndarray, k_cache: KVStore, v_cache: KVStore, plan: AttentionPlan, cfg: Gemma3Config, run_min: int = RUN_MIN
) -> np.ndarray:
    """Softmax attention of the step's queries q [T, nh, hd], each over its own keys (the module
    doc); a masked position reads the query's first key (probability 0). A sequence with
    `run_min` or more queries in the step reads its keys once and takes each query's window as a
    view of them; the others copy each query's window. Both give each window the same values and
    numpy the same strides, so the same bits."""
    nkv, group, hd = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    seen = plan.positions - plan.lo + 1  # [T] keys each query sees
    padded = -(-seen // ATTN_BUCKET) * ATTN_BUCKET
    q = q.reshape(len(q), nkv, group, hd)  # query head j uses kv head j // group
    out = np.empty_like(q)
    copied = np.ones(len(q), bool)
    seqs, counts = np.unique(plan.seqs, return_counts=True)
    for s in seqs[counts >= run_min].tolist():
        run = np.flatnonzero(plan.seqs == s)  # consecutive tokens at consecutive positions
        if _attend_run(q, out, run, padded, seen, k_cache, v_cache, plan, cfg):
            copied[run] = False
    for b in np.unique(padded[copied]).tolist():
        queries = np.flatnonzero(copied & (padded == b))
        step = max(1, ATTN_WINDOWS // (b * nkv * hd))
        for part in (queries[i : i + step] for i in range(0, len(queries), step)):
            pos = np.maximum(plan.positions[part, None] - b + 1 + np.arange(b), plan.lo[part, None])  # [n, b]
            slots = _slots(plan, plan.seqs[part, None], pos).ravel()
            k, v = (store.read(slots).reshape(len(part), b, nkv, hd) for store in (k_cache, v_cache))
            # k: [n, nkv, hd, b], v: [n, nkv, b, hd], as views
            out[part] = _weigh(q[part], k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), b - seen[part], cfg)
    return out.reshape(len(q), cfg.num_heads, cfg.head_dim)


def attend_tiles(pool: ThreadPoolExecutor | None, q: np.ndarray, k_cache: KVStore, v_cache: KVStore,
                 plan: AttentionPlan, cfg: Gemma3Config, tile: int) -> np.ndarray:
    """`attend` of the queries in pieces of `tile` on the pool's threads (none, or one piece: on
    this thread). The same bits: a query's arithmetic is its own (the module doc)."""
    cuts = range(0, len(q), tile)
    if pool is None or len(cuts) == 1:
        return attend(q, k_cache, v_cache, plan, cfg)
    pieces = [slice(i, i + tile) for i in cuts]
    return np.concatenate(list(pool.map(lambda r: attend(q[r], k_cache, v_cache, plan.rows(r), cfg), pieces)))


def _attend_run(q, out, run, padded, seen, k_cache, v_cache, plan, cfg) -> bool:
    """The queries `run` of one sequence over its keys read once; False (nothing done) where a
    window would hold another masked key than the copying path's (a window not a bucket multiple)."""
    first = int(run[0])
    lo0, p0, p1 = int(plan.lo[first]), int(plan.positions[first]), int(plan.positions[run[-1]])
    lo, pos, b_run = plan.lo[run], plan.positions[run], padded[run]
    if not ((pos - b_run + 1 >= lo) | (lo == lo0)).all():
        return False
    g0 = p0 - int(b_run.max()) + 1  # the first key position any window starts at (masked below lo0)
    keys = np.maximum(np.arange(g0, p1 + 1), lo0)
    slots = _slots(plan, np.full(len(keys), plan.seqs[first]), keys)
    k, v = (store.read(slots) for store in (k_cache, v_cache))  # [L, nkv, hd]
    for b in np.unique(b_run).tolist():
        part = run[b_run == b]  # consecutive: padded grows with the position
        start = int(plan.positions[part[0]]) - b + 1 - g0
        k_win, v_win = (_windows(a, start, len(part), b) for a in (k, v))  # [n, nkv, hd, b]
        out[part] = _weigh(q[part], k_win, v_win.transpose(0, 1, 3, 2), b - seen[part], cfg)
    return True


def _windows(a: np.ndarray, start: int, n: int, b: int) -> np.ndarray:
    """Views [n, heads, hd, b] of a [L, heads, hd]: window i is a[start + i : start + i + b]
    (numpy's sliding_window_view, without its checks' cost on many small runs)."""
    rows, heads, hd = a.strides
    return np.ndarray((n, a.shape[1], a.shape[2], b), a.dtype, a, start * rows, (rows, heads, hd, rows))


def _slots(plan: AttentionPlan, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Cache slots of positions `pos` of sequences `seqs` (broadcast together)."""
    bs = plan.block_size
    return plan.table[seqs, pos // bs] * bs + pos % bs


def _weigh(q: np.ndarray, k: np.ndarray, v: np.ndarray, masked: np.ndarray, cfg: Gemma3Config) -> np.ndarray:
    """softmax(q k * scale) v for q [n, nkv, group, hd], k [n, nkv, hd, b], v [n, nkv, b, hd]; the
    first `masked` [n] keys of each window have probability 0."""
    b = k.shape[-1]
    scores = (q @ k) * np.float32(cfg.attn_scale)  # [n, nkv, group, b]
    hidden = masked[:, None] > np.arange(b)  # [n, b]: before the query's first key
    if hidden.any():  # (none hidden: the same arithmetic without the mask)
        scores[np.broadcast_to(hidden[:, None, None, :], scores.shape)] = -np.inf
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs @ v  # [n, nkv, group, hd]
