"""Greedy generation of a fixed list of prompts on a backend: the engine without a job around it.

Tests and the Python API use it; the batch job drives `Engine` itself.
"""

from __future__ import annotations

from ..backends.base import Backend
from .engine import Engine, Request, StepHook
from .kv_plan import KVPlan
from .sampling_params import SamplingParams


def generate_greedy(
    backend: Backend,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] | list[frozenset[int]] = frozenset(),
    block_size: int = 16,
    num_blocks: dict[str, int] | None = None,
    step_token_budget: int = 512,
    on_step: StepHook | None = None,
    max_batch: int | None = None,
) -> list[list[int]]:
    """Greedy completions (token ids, stop token included) for `prompts`, run through the engine.

    `stop_token_ids` is one set for every prompt or a set per prompt. `num_blocks` defaults to
    enough for every sequence at full length; `max_batch` to all prompts at once. `on_step` sees
    each step's prompt indices, batch and result (tests collect logits).
    """
    longest = max(len(p) for p in prompts) + max_new_tokens
    if num_blocks is None:
        per_seq = -(-longest // block_size)
        num_blocks = {g.name: per_seq * len(prompts) for g in backend.cfg.kv_groups()}
    plan = KVPlan(block_size, dict(num_blocks), longest, 0, 0, 1)
    batch = max_batch or len(prompts)
    engine = Engine(backend, plan, None, batch, max(step_token_budget, batch), on_step)
    stops = [stop_token_ids] * len(prompts) if isinstance(stop_token_ids, frozenset) else stop_token_ids
    params = SamplingParams(max_tokens=max_new_tokens)
    for i, (prompt, stop) in enumerate(zip(prompts, stops)):
        engine.add(Request(i, prompt, params, stop))
    completions: dict[int, list[int]] = {}
    while engine.num_unfinished:
        completions.update((c.request_id, c.token_ids) for c in engine.step())
    return [completions[i] for i in range(len(prompts))]
