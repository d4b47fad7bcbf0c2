"""The CPU backend's attention over its paged KV cache, batch-invariant by construction.

A query at position p sees the keys of its sequence at positions [lo, p] (lo = max(0, p - window + 1)
on sliding layers, else 0). It computes over the ATTN_BUCKET-multiple L_pad >= L of positions
ending with its own, the ones before lo masked, so its arithmetic has the shapes of L_pad alone and
its bits depend only on its own query and keys; queries of one L_pad, of any sequences, go through
numpy together (`attend`). Shapes: T tokens, nh/nkv heads of hd.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.config import Gemma3Config
from .base import StepBatch
from .kv_formats import KVStore

F32 = np.float32
ATTN_BUCKET = 64  # a query's keys are padded to a multiple of this
ATTN_WINDOWS = 1 << 22  # key (and value) window elements copied at once, at most (a longer run goes in parts)


@dataclass
class AttentionPlan:
    """Which keys each query of the step sees in one KV group: keys at positions [lo, p] of its
    sequence, found through the block table."""

    seqs: np.ndarray  # [T] the sequence of each token
    positions: np.ndarray  # [T] p
    lo: np.ndarray  # [T] the first position it sees
    table: np.ndarray  # [S, max_blocks] block ids
    block_size: int


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


def attend(q: np.ndarray, k_cache: KVStore, v_cache: KVStore, plan: AttentionPlan, cfg: Gemma3Config) -> np.ndarray:
    """Softmax attention of the step's queries q [T, nh, hd], each over its own keys (the module
    doc); a masked position reads the query's first key (probability 0)."""
    bs = plan.block_size
    nkv, group, hd = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    seen = plan.positions - plan.lo + 1  # [T] keys each query sees
    padded = -(-seen // ATTN_BUCKET) * ATTN_BUCKET
    q = q.reshape(len(q), nkv, group, hd)  # query head j uses kv head j // group
    out = np.empty_like(q)
    for b in np.unique(padded).tolist():
        runs = np.flatnonzero(padded == b)
        step = max(1, ATTN_WINDOWS // (b * nkv * hd))
        for part in (runs[i : i + step] for i in range(0, len(runs), step)):
            pos = np.maximum(plan.positions[part, None] - b + 1 + np.arange(b), plan.lo[part, None])  # [n, b]
            slots = (plan.table[plan.seqs[part, None], pos // bs] * bs + pos % bs).ravel()
            k, v = (store.read(slots).reshape(len(part), b, nkv, hd) for store in (k_cache, v_cache))
            scores = (q[part] @ k.transpose(0, 2, 3, 1)) * F32(cfg.attn_scale)  # [n, nkv, group, b]
            hidden = (b - seen[part])[:, None] > np.arange(b)  # [n, b]: before the query's first key
            if hidden.any():  # (none hidden: the same arithmetic without the mask)
                scores[np.broadcast_to(hidden[:, None, None, :], scores.shape)] = -np.inf
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[part] = probs @ v.transpose(0, 2, 1, 3)  # [n, nkv, group, hd]
    return out.reshape(len(q), cfg.num_heads, cfg.head_dim)

