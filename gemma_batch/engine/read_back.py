"""What a step reads back besides its sampled ids, and what for: the log-probabilities of a scored
sequence's choice tokens (`StepBatch.score_tokens`, `engine.choices`: from its prompt's last token
on), and the whole logits row a request with `logprobs` samples from (`StepBatch.logit_rows`,
`engine.token_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends.base import StepBatch
from .choices import ChoiceScores
from .sequence import Sequence


@dataclass
class ReadBack:
    """A step's reads: `score_tokens`/`score_ids` and `logit_rows` as StepBatch takes them (None:
    none), the scored positions as (first score, scores, sequence, position), and each logprobs
    sequence's row of `logit_rows` by its place in the step."""

    score_tokens: np.ndarray | None = None
    score_ids: np.ndarray | None = None
    logit_rows: np.ndarray | None = None
    scored: list[tuple[int, int, Sequence, int]] = field(default_factory=list)
    logprob_rows: dict[int, int] = field(default_factory=dict)


def read_back(scheduled: list[tuple[Sequence, int]], batch: StepBatch, scores: list[ChoiceScores | None],
              logprobs: list[bool]) -> ReadBack:
    """The reads of a step of `scheduled` (sequence, tokens), before its tokens count as cached;
    `scores` the scoring of each scored sequence (None for the others), `logprobs` whether a
    sequence's sampled row is wanted."""
    out = ReadBack()
    tokens: list[int] = []
    ids: list[int] = []
    for (seq, n), start, score in zip(scheduled, batch.seq_starts, scores):
        if score is None:
            continue
        for k in range(n):
            position = seq.num_cached_tokens + k
            if position >= score.prompt_len - 1:
                wanted = score.wanted(position)
                out.scored.append((len(ids), len(wanted), seq, position))
                tokens += [int(start) + k] * len(wanted)
                ids += wanted
    if ids:
        out.score_tokens, out.score_ids = np.asarray(tokens, np.int32), np.asarray(ids, np.int32)
    rows = []
    for s, wanted in enumerate(logprobs):
        if wanted and batch.sample[s] and scores[s] is None:
            out.logprob_rows[s] = len(rows)
            rows.append(int(batch.seq_starts[s + 1]) - 1)
    if rows:
        out.logit_rows = np.asarray(rows, np.int32)
    return out
