"""Which rows' logits a step returns besides its sampled ids (`StepBatch.logit_rows`), and what for.

A scored sequence (`engine.choices`) needs every row from its prompt's last on; a request with
`logprobs` needs its sampled row (`engine.token_logprobs`).
"""

from __future__ import annotations

import numpy as np

from ..backends.base import StepBatch
from .sequence import Sequence


def logit_rows(
    scheduled: list[tuple[Sequence, int]], batch: StepBatch, prompt_lens: list[int | None], logprobs: list[bool],
) -> tuple[np.ndarray | None, list[tuple[int, Sequence, int]], dict[int, int]]:
    """(the flat token indices or None, the scored rows as (index there, sequence, position), and
    each logprobs sequence's index there by its place in the step). `scheduled` is the step's
    (sequence, tokens) before they count as cached; `prompt_lens` the prompt length of each scored
    sequence (None for the others); `logprobs` whether a sequence's sampled row is wanted."""
    rows: list[int] = []
    scored = []
    for (seq, n), start, prompt_len in zip(scheduled, batch.seq_starts, prompt_lens):
        if prompt_len is not None:
            for k in range(n):
                position = seq.num_cached_tokens + k
                if position >= prompt_len - 1:
                    scored.append((len(rows), seq, position))
                    rows.append(int(start) + k)
    sampled = {}
    for s, wanted in enumerate(logprobs):
        if wanted and batch.sample[s] and prompt_lens[s] is None:
            sampled[s] = len(rows)
            rows.append(int(batch.seq_starts[s + 1]) - 1)
    return (np.asarray(rows, np.int32) if rows else None), scored, sampled
