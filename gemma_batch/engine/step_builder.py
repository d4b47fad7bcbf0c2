"""Turn the sequences scheduled for a step into the flat `StepBatch` a backend runs, and their
requests into its `SamplingBatch`."""

from __future__ import annotations

import numpy as np

from ..backends.base import SamplingBatch, StepBatch
from .request import Request
from .sequence import PENDING, Sequence


def build_step(
    scheduled: list[tuple[Sequence, int]], group_names: list[str], block_size: int, return_logits: bool = False,
    previous: list[Sequence] | None = None,
) -> StepBatch:
    """Build one step from `(sequence, number of its uncached tokens to run)` pairs.

    The sequences' block tables must already cover every position the step writes or reads.
    A sequence is sampled when the step reaches the end of its known tokens. A token still
    being sampled (sequence.PENDING) by the step submitted before this one, whose sequences are
    `previous` in its order, gets that sequence's index there as its `token_sources` entry.
    """
    tokens, positions, starts, context_lens, sample = [], [], [0], [], []
    for seq, n in scheduled:
        begin = seq.num_cached_tokens
        tokens.extend(seq.token_ids[begin : begin + n])
        positions.extend(range(begin, begin + n))
        starts.append(starts[-1] + n)
        context_lens.append(begin + n)
        sample.append(begin + n == seq.num_tokens)
    pos = np.asarray(positions, np.int32)
    row = np.repeat(np.arange(len(scheduled)), np.diff(starts))  # [T] sequence of each token
    tables, slots = {}, {}
    for name in group_names:
        width = max(len(seq.block_tables[name]) for seq, _ in scheduled)
        table = np.full((len(scheduled), width), -1, np.int32)  # [S, max_blocks]
        for s, (seq, _) in enumerate(scheduled):
            table[s, : len(seq.block_tables[name])] = seq.block_tables[name]
        tables[name] = table
        slots[name] = (table[row, pos // block_size] * block_size + pos % block_size).astype(np.int32)
    token_ids = np.asarray(tokens, np.int32)
    sources = None
    pending = np.flatnonzero(token_ids == PENDING)
    if pending.size:
        if previous is None:
            raise RuntimeError("a step has a pending token but no step before it samples it")
        index = {seq.seq_id: i for i, seq in enumerate(previous)}
        sources = np.full(len(token_ids), -1, np.int32)
        for t in pending:
            sources[t] = index[scheduled[row[t]][0].seq_id]
    return StepBatch(
        token_ids=token_ids,
        token_sources=sources,
        positions=pos,
        seq_starts=np.asarray(starts, np.int32),
        context_lens=np.asarray(context_lens, np.int32),
        block_tables=tables,
        slots=slots,
        sample=np.asarray(sample, bool),
        return_logits=return_logits,
        prompt_lens=np.asarray([seq.num_prompt_tokens for seq, _ in scheduled], np.int32),
    )


def build_sampling(scheduled: list[tuple[Sequence, int]], requests: list[Request], sample: np.ndarray,
                   tokenizer_vocab: int) -> SamplingBatch:
    """The step's sampling parameters, one per scheduled sequence (`requests` in the same order);
    where a sampled one (`sample`) has a grammar, its masks follow (`Backend.allow`)."""
    return SamplingBatch(
        masks_follow=any(r.matcher is not None and sampled for r, sampled in zip(requests, sample)),
        temperature=np.array([r.params.temperature for r in requests], np.float32),
        top_k=np.array([r.params.top_k for r in requests], np.int32),
        top_p=np.array([r.params.top_p for r in requests], np.float32),
        min_p=np.array([r.params.min_p for r in requests], np.float32),
        keys=np.array([r.rng_key for r in requests], np.uint32).reshape(-1, 2),
        counters=np.array([seq.num_completion_tokens for seq, _ in scheduled], np.uint32),
        vocab_size=tokenizer_vocab,
    )
