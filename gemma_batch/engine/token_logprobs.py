"""A generated token's log-probability and its most likely alternatives (`--logprobs K`).

Log-probabilities are of the model's distribution after a grammar's mask and before temperature
and the sampling filters (as vLLM reports them by default): a float64 log-softmax of the float32
logits over the tokenizer's ids, those the mask forbids at -inf. The alternatives are the K most
likely ids, ties in id order.
"""

from __future__ import annotations

import numpy as np

from ..backends.sampler import allowed_only, log_softmax
from ..model.tokenizer import Tokenizer


def token_logprobs(logits: np.ndarray, token: int, k: int, tokenizer: Tokenizer, allowed: np.ndarray | None) -> dict:
    """{"token_id", "token", "logprob", "top_logprobs": [{"token_id", "token", "logprob"}, ...]} of
    `token` drawn from `logits` [V] (`allowed`: the grammar's mask words, or None)."""
    logits = logits[: tokenizer.vocab_size]
    if allowed is not None and (allowed != -1).any():
        logits = allowed_only(logits, allowed)
    lp = log_softmax(logits)
    top = []
    if k:  # the ids at or above the k-th largest, then sorted: O(V), not a sort of the vocabulary
        kth = np.partition(lp, len(lp) - k)[len(lp) - k]
        candidates = np.flatnonzero(lp >= kth)
        top = candidates[np.lexsort((candidates, -lp[candidates]))][:k]

    def entry(t: int) -> dict:
        return {"token_id": t, "token": tokenizer.piece_bytes(t).decode("utf-8", "replace"), "logprob": float(lp[t])}

    return {**entry(token), "top_logprobs": [entry(int(t)) for t in top]}
