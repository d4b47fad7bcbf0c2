"""A submitted step and what comes back from it: the logits rows its LM head and sampler run (the
sampled rows, or every token's with `return_logits`, then `logit_rows`, then the score tokens'),
where each sequence's draw lands, how row_scores.comp takes the score pairs, the step buffers it
needs, its inputs written (`write_step`), and the result read once the step is done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...model.config import Gemma3Config
from ..base import StepBatch, StepResult
from .prompt_rows import prompt_rows
from .step_buffers import SCORES_PER_ROW, Capacity, StepBuffers, StepInputs


@dataclass
class InFlight:
    """A submitted step: its input set, its logits rows, the ids row of each sequence's sampled
    token, and once waited for, its result and GPU seconds per dispatch."""

    slot: int
    batch: StepBatch
    rows: np.ndarray
    id_rows: np.ndarray
    masks_due: bool = False  # its sampler waits for the grammar masks (`VulkanBackend.allow`)
    score_rows: int = 0  # logits rows of its score tokens, the last ones
    score_order: np.ndarray | None = None  # where each of `score_tokens`' pairs is among row_scores.comp's
    result: StepResult | None = None
    timeline: list[tuple[str, float]] = field(default_factory=list)  # GPU seconds a dispatch, in order


def logits_rows(batch: StepBatch, scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the flat token of each logits row [R], the logits row of each sequence's draw [S]). The
    sampler draws for `logit_rows` and the score tokens (`scored`: StepBatch.score_rows) too, unread."""
    last = batch.seq_starts[1:] - 1
    rows = np.arange(batch.num_tokens, dtype=np.int32) if batch.return_logits else last[batch.sample].astype(np.int32)
    extra = np.zeros(0, np.int32) if batch.logit_rows is None else batch.logit_rows
    rows = np.concatenate([rows, extra, scored]).astype(np.int32)
    id_rows = last if batch.return_logits else np.cumsum(batch.sample) - 1
    return rows, id_rows


def score_layout(batch: StepBatch, tokens: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """row_scores.comp's inputs for `score_tokens` and `score_ids` [P], whose distinct tokens
    (StepBatch.score_rows) have the logits rows from `first` on (`logits_rows`): its header (the
    rows, then (logits row, first pair, pairs) each), the pairs' ids grouped by row, and where
    each pair is among them."""
    inverse = np.searchsorted(tokens, batch.score_tokens)
    grouped = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(tokens))
    rows = np.stack([first + np.arange(len(tokens)), np.cumsum(counts) - counts, counts], axis=1)
    order = np.empty(len(grouped), np.int64)
    order[grouped] = np.arange(len(grouped))
    return np.concatenate([[len(tokens)], rows.ravel()]).astype(np.uint32), batch.score_ids[grouped], order


def read_result(step: InFlight, inputs: StepInputs, logits: Callable[[int, int], np.ndarray]) -> StepResult:
    """The StepResult of a finished step from its input set (the drawn ids, row_scores.comp's
    scores) and `logits(first, n)`, which reads n rows of the logits buffer [n, V] from row `first`."""
    batch = step.batch
    ids = StepBuffers.view(inputs.ids, np.int32, len(step.rows))
    scores = StepBuffers.view(inputs.scores, np.float32, 0 if step.score_order is None else len(step.score_order))
    next_ids = np.full(batch.num_seqs, -1, np.int32)
    next_ids[batch.sample] = ids[step.id_rows[batch.sample]]
    extra = 0 if batch.logit_rows is None else len(batch.logit_rows)
    first = len(step.rows) - extra - step.score_rows
    return StepResult(next_ids, logits(0, batch.num_tokens) if batch.return_logits else None,
                      logits(first, extra) if extra else None,
                      None if step.score_order is None else scores[step.score_order].astype(np.float64))


@dataclass(frozen=True)
class StepRows:
    """A step's logits rows (`logits_rows`), its score tokens (StepBatch.score_rows), and the
    step buffers it needs: worked out once a step."""

    scored: np.ndarray
    rows: np.ndarray
    id_rows: np.ndarray
    capacity: Capacity


def step_rows(batch: StepBatch) -> StepRows:
    scored = batch.score_rows()
    rows, id_rows = logits_rows(batch, scored)
    pairs = 0 if batch.score_tokens is None else len(batch.score_tokens)
    capacity = Capacity(batch.num_tokens, batch.num_seqs, max(len(rows), 1, -(-pairs // SCORES_PER_ROW)),
                        tuple((g, t.shape[1]) for g, t in batch.block_tables.items()))
    return StepRows(scored, rows, id_rows, capacity)


def write_step(batch: StepBatch, token_ids: np.ndarray, layout: StepRows, slot: int, inputs: StepInputs,
               cfg: Gemma3Config, grids: Callable[..., np.ndarray], flash: bool, prompt_tile: bool) -> InFlight:
    """Write the step's inputs into input set `slot` (`inputs`; `grids`: StepGraph.grids, once the
    step's recording is made): the step as submitted. `flash`, `prompt_tile`: whether the device
    runs prompt tokens on those kernels (prompt_rows.py)."""
    rows, scored, s = layout.rows, layout.scored, batch.sampling
    pairs = 0 if batch.score_tokens is None else len(batch.score_tokens)
    vocab_limit = s.vocab_size if s is not None and s.vocab_size else cfg.vocab_size
    p = prompt_rows(batch, cfg, flash, prompt_tile)
    counts = grids(batch.num_tokens, len(rows), p.scalar_positions, 0 if p.tiles is None else len(p.tiles), p.start)
    header, ids, order = score_layout(batch, scored, len(rows) - len(scored)) if pairs else (None, None, None)
    inputs.write(batch, token_ids, rows, vocab_limit, counts, p.flash, p.tiles, p.start, None if pairs == 0 else (header, ids))
    if s is not None and s.allowed is not None:  # (given already)
        inputs.write_masks(s.allowed, batch.sample, layout.id_rows)
    masks_due = s is not None and s.masks_follow and s.allowed is None
    return InFlight(slot, batch, rows, layout.id_rows, masks_due, len(scored), order)
