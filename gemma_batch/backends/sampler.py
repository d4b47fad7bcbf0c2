"""Token sampling from logits, the numpy reference every backend's on-device sampler follows.

One draw for sequence s, from its row of logits x (float32):

0. Only ids below `vocab_size` count (the tokenizer's; 4B+ checkpoints have 64 padding rows
   past it, which transformers does not mask but no tokenizer can decode), and of those only the
   ids `allowed` lets through (a constrained completion's grammar): the others' logits are -inf.
1. temperature 0: the arg-max (lowest id on ties). Otherwise x = x / temperature.
2. Candidates in a fixed order: logit descending, then token id ascending (token id order when
   no filter is on).
3. top-k keeps the first k candidates; top-p keeps the shortest prefix whose probability mass
   reaches p; min-p drops candidates whose probability is below min_p times the largest.
   Probabilities are softmax over the candidates left by the previous filter (HF's warper order:
   temperature, top-k, top-p, min-p).
4. u = uniform(keys[s], counters[s]) picks the first candidate whose cumulative probability
   exceeds u times the total.

u comes from Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC'11), a counter-based generator that is easy to reproduce in a shader: the counter is
(counter, 0, 0, 0), the key the sequence's two words, and u is the top 24 bits of the first
output word over 2**24. A draw therefore depends only on the row's key and token index.
"""

from __future__ import annotations

import numpy as np

from .base import NON_FINITE, SamplingBatch

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter: np.ndarray, key: np.ndarray, rounds: int = 10) -> np.ndarray:
    """Philox-4x32 of counters [N, 4] uint32 under keys [N, 2] uint32 -> [N, 4] uint32."""
    c = [counter[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[:, 0].astype(np.uint32), key[:, 1].astype(np.uint32)
    for r in range(rounds):
        if r:
            k0, k1 = k0 + _W0, k1 + _W1  # uint32 wrap-around
        p0, p1 = _M0 * c[0], _M1 * c[2]  # 32 x 32 -> 64-bit products
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & _LOW32, p1 >> np.uint64(32), p1 & _LOW32
        c = [hi1 ^ c[1] ^ k0.astype(np.uint64), lo1, hi0 ^ c[3] ^ k1.astype(np.uint64), lo0]
    return np.stack(c, axis=1).astype(np.uint32)


def uniform(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One float64 in [0, 1) per sequence, with 24 random bits, from keys [S, 2] and counters [S]."""
    counter = np.zeros((len(counters), 4), np.uint32)
    counter[:, 0] = counters
    word = philox4x32(counter, keys)[:, 0]
    return (word >> np.uint32(8)).astype(np.float64) / float(1 << 24)


def candidates(x: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens a draw can pick from logits x [V] (float32), and their unnormalised weights.

    Never sorts the whole vocabulary when a filter is on: top-k partitions first; min-p keeps the
    weights >= min_p before sorting; top-p sorts a growing top slice until the nucleus provably
    ends inside it (its last token's logit above the slice's smallest). The result is the same as
    sorting everything, and the total mass is a sum in candidate order, not in sorted order.
    """
    x = x / np.float32(temperature)
    ids = np.argpartition(-x, top_k - 1)[:top_k] if 0 < top_k < len(x) else np.arange(len(x))
    logits = x[ids]
    weights = np.exp((logits - logits.max()).astype(np.float64))  # the largest weight is 1
    if top_p < 1.0:
        keep = _nucleus(logits, ids, weights, top_p * weights.sum())
    elif top_k > 0 or min_p > 0.0:
        keep = np.flatnonzero(weights >= min_p) if min_p > 0.0 else np.arange(len(ids))
        keep = keep[np.lexsort((ids[keep], -logits[keep]))]  # logit descending, then id ascending
    else:
        return ids, weights
    ids, weights = ids[keep], weights[keep]
    if min_p > 0.0:
        survive = weights >= min_p * weights.max()
        ids, weights = ids[survive], weights[survive]
    return ids, weights


def _nucleus(logits: np.ndarray, ids: np.ndarray, weights: np.ndarray, target: float) -> np.ndarray:
    """Positions, in (logit desc, id asc) order, of the shortest sorted prefix whose weight reaches target."""
    size = min(len(ids), 1024)
    while True:
        top = np.argpartition(-logits, size - 1)[:size] if size < len(ids) else np.arange(len(ids))
        top = top[np.lexsort((ids[top], -logits[top]))]
        n = int(np.searchsorted(np.cumsum(weights[top]), target, side="left")) + 1
        if size == len(ids) or (n <= size and logits[top[n - 1]] > logits[top[-1]]):
            return top[:n]
        size = min(len(ids), size * 8)


def draw(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The first candidate whose cumulative weight exceeds u times the total."""
    mass = np.cumsum(probs)
    return int(ids[min(int(np.searchsorted(mass, u * mass[-1], side="right")), len(ids) - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax over the last axis of float32 logits."""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def scores(logits: np.ndarray, rows: np.ndarray, sampling: SamplingBatch | None, tokens: np.ndarray,
           ids: np.ndarray) -> np.ndarray:
    """`StepResult.scores` [P] for the pairs (`tokens`, `ids`) [P] of `StepBatch.score_tokens` and
    `score_ids`, from the logits [len(rows), V] of the flat tokens `rows` (ascending, each once)."""
    limit = sampling.vocab_size if sampling is not None and sampling.vocab_size else logits.shape[1]
    return log_softmax(logits[:, :limit])[np.searchsorted(rows, tokens), ids]


def allowed_only(logits: np.ndarray, words: np.ndarray) -> np.ndarray:
    """logits [V] with -inf where the bitmask `words` [ceil(V / 32)] int32 has the token's bit off."""
    bits = np.unpackbits(words.astype("<i4").view(np.uint8), bitorder="little")[: len(logits)]
    return np.where(bits.astype(bool), logits, np.float32(-np.inf))


def sample_tokens(logits: np.ndarray, sampling: SamplingBatch | None, rows: np.ndarray) -> np.ndarray:
    """Token ids [len(rows)] drawn from logits [len(rows), V] for the sequences `rows` of the step;
    NON_FINITE for a row whose logits (those its mask lets through) hold a NaN or +inf: the
    arg-max lands on one (numpy's arg-max takes a NaN as the largest), so one look per row finds it."""
    if sampling is not None and sampling.vocab_size:
        logits = logits[:, : sampling.vocab_size]
    if sampling is not None and sampling.allowed is not None:
        masked = [i for i, s in enumerate(rows) if (sampling.allowed[s] != -1).any()]
        if masked:
            logits = logits.copy()
            for i in masked:
                logits[i] = allowed_only(logits[i], sampling.allowed[rows[i]])
    greedy = np.argmax(logits, axis=-1).astype(np.int32)
    finite = np.isfinite(logits[np.arange(len(greedy)), greedy])
    greedy[~finite] = NON_FINITE
    if sampling is None:
        return greedy
    u = uniform(sampling.keys[rows], sampling.counters[rows])
    for i, s in enumerate(rows):
        if sampling.temperature[s] > 0 and finite[i]:
            ids, probs = candidates(
                logits[i], float(sampling.temperature[s]), int(sampling.top_k[s]),
                float(sampling.top_p[s]), float(sampling.min_p[s]),
            )
            greedy[i] = draw(ids, probs, float(u[i]))
    return greedy
