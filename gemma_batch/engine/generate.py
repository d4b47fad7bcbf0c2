"""Greedy generation for a fixed set of prompts that run together (chunked prefill, then decode).

This is the simplest driver of the step contract: every sequence is admitted at once, each step
gives each unfinished sequence either its next prefill chunk (within a per-step token budget) or
its one decode token. The batch job's scheduler builds on the same pieces.
"""

from __future__ import annotations

from collections.abc import Callable

from ..backends.base import Backend, StepBatch, StepResult
from .kv_cache import KVCacheManager
from .sequence import Sequence
from .step_builder import build_step


def generate_greedy(
    backend: Backend,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] | list[frozenset[int]] = frozenset(),
    block_size: int = 16,
    num_blocks: dict[str, int] | None = None,
    step_token_budget: int = 512,
    on_step: Callable[[list[int], StepBatch, StepResult], None] | None = None,
) -> list[list[int]]:
    """Greedy completions (token ids, stop token included) for `prompts`, computed as one batch.

    `stop_token_ids` is one set for every prompt or a set per prompt. `num_blocks` defaults to enough for every sequence at full length; `on_step` sees each step's
    prompt indices (one per sequence in the batch), batch and result (tests collect logits).
    """
    cfg = backend.cfg
    groups = cfg.kv_groups()
    if num_blocks is None:
        longest = max(len(p) for p in prompts) + max_new_tokens
        per_seq = -(-longest // block_size)
        num_blocks = {g.name: per_seq * len(prompts) for g in groups}
    backend.allocate_kv(num_blocks, block_size)
    kv = KVCacheManager(groups, num_blocks, block_size)
    stops = [stop_token_ids] * len(prompts) if isinstance(stop_token_ids, frozenset) else stop_token_ids
    seqs = [Sequence.from_prompt(i, p, max_new_tokens, stop) for i, (p, stop) in enumerate(zip(prompts, stops))]

    while running := [s for s in seqs if not s.finished]:
        scheduled, budget = [], step_token_budget
        for seq in sorted(running, key=lambda s: s.num_uncached_tokens > 1):  # decode tokens first
            n = min(seq.num_uncached_tokens, budget)
            if n == 0:
                break
            kv.allocate(seq, seq.num_cached_tokens + n)
            scheduled.append((seq, n))
            budget -= n
        batch = build_step(scheduled, [g.name for g in groups], block_size, return_logits=on_step is not None)
        result = backend.step(batch)
        if on_step is not None:
            on_step([seq.seq_id for seq, _ in scheduled], batch, result)
        for s, (seq, n) in enumerate(scheduled):
            seq.num_cached_tokens += n
            kv.release_out_of_window(seq)
            if batch.sample[s]:
                seq.append(int(result.token_ids[s]))
            if seq.finished:
                kv.free(seq)
    return [s.completion_ids for s in seqs]

