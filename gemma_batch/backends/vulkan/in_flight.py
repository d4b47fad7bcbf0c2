"""A submitted step and what comes back from it: the logits rows its LM head and sampler run (the
sampled rows, or every token's with `return_logits`, then `logit_rows`), where each sequence's
draw lands, and the result read once the step is done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..base import StepBatch, StepResult


@dataclass
class InFlight:
    """A submitted step: its input set, its logits rows, the ids row of each sequence's sampled
    token, and once waited for, its result and GPU seconds per kernel."""

    slot: int
    batch: StepBatch
    rows: np.ndarray
    id_rows: np.ndarray
    masks_due: bool = False  # its sampler waits for the grammar masks (`VulkanBackend.allow`)
    result: StepResult | None = None
    profile: dict[str, float] = field(default_factory=dict)


def logits_rows(batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """(the flat token of each logits row [R], the logits row of each sequence's draw [S]). The
    sampler draws for `logit_rows` too; those draws are not read."""
    last = batch.seq_starts[1:] - 1
    rows = np.arange(batch.num_tokens, dtype=np.int32) if batch.return_logits else last[batch.sample].astype(np.int32)
    if batch.logit_rows is not None:
        rows = np.concatenate([rows, batch.logit_rows]).astype(np.int32)
    id_rows = last if batch.return_logits else np.cumsum(batch.sample) - 1
    return rows, id_rows


def read_result(step: InFlight, ids: np.ndarray, logits: Callable[[int, int], np.ndarray]) -> StepResult:
    """The StepResult of a finished step from its drawn `ids` [R] and `logits(first, n)`, which
    reads n rows of the logits buffer [n, V] from row `first`."""
    batch = step.batch
    next_ids = np.full(batch.num_seqs, -1, np.int32)
    next_ids[batch.sample] = ids[step.id_rows[batch.sample]]
    extra = 0 if batch.logit_rows is None else len(batch.logit_rows)
    return StepResult(next_ids, logits(0, batch.num_tokens) if batch.return_logits else None,
                      logits(len(step.rows) - extra, extra) if extra else None)
