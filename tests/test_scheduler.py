"""Scheduler and KV cache invariants under random workloads, with a backend that checks its cache.

`RecordingBackend` stores (token, position) in every KV slot it is told to write and, for every
query, reads back each key its sequence may see (per KV group, honouring the sliding window)
through the block table, failing on a slot that does not hold that sequence's token at that
position. Its next token is a hash of everything the query saw, so a wrong block table, a lost
block or a bad recomputation after preemption changes the output. It also checks StepBatch's
contract on prompt tokens: they come last, and no sequence feeds prompt and other tokens in a step.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.base import Backend, StepBatch, StepResult
from gemma_batch.engine.engine import AHEAD_ENV, Engine, Request
from gemma_batch.engine.kv_plan import KVPlan, blocks_per_sequence, plan_kv
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.engine.scheduler import SMALL_STEP_ROUNDS
from gemma_batch.model.config import Gemma3Config
from tests.tiny_models import TINY_TEXT

VOCAB = 97


class RecordingBackend(Backend):
    name = "recording"

    def load_weights(self, tensors) -> None:  # no weights: outputs are hashes of the cache
        pass

    def available_memory(self) -> int:
        return 1 << 30

    def kv_bytes_per_token(self, group: str) -> int:
        return 8

    def allocate_kv(self, num_blocks, block_size) -> None:
        self.block_size = block_size
        self.cache = {name: np.full((n * block_size, 2), -1, np.int64) for name, n in num_blocks.items()}

    def step(self, batch: StepBatch) -> StepResult:
        out = np.full(batch.num_seqs, -1, np.int32)
        prompt = batch.positions < np.repeat(batch.prompt_lens, np.diff(batch.seq_starts))
        assert prompt[len(prompt) - prompt.sum():].all(), "prompt tokens not last, or mixed with a sequence's others"
        for g in self.cfg.kv_groups():
            self.cache[g.name][batch.slots[g.name]] = np.stack([batch.token_ids, batch.positions], axis=1)
        for s in range(batch.num_seqs):
            start, end = batch.seq_starts[s], batch.seq_starts[s + 1]
            fed = dict(zip(batch.positions[start:end].tolist(), batch.token_ids[start:end].tolist()))
            last = int(batch.positions[end - 1])
            h = 0
            for g in self.cfg.kv_groups():
                first = 0 if g.window is None else max(0, last - g.window + 1)
                for k in range(first, last + 1):
                    block = batch.block_tables[g.name][s, k // self.block_size]
                    assert block >= 0, f"{g.name}: position {k} has no block"
                    token, pos = self.cache[g.name][block * self.block_size + k % self.block_size]
                    assert pos == k and (k not in fed or token == fed[k]), f"{g.name}: slot of position {k} overwritten"
                    h = (h * 31 + int(token) * (k + 1)) % 1_000_003
            out[s] = h % VOCAB if batch.sample[s] else -1
        return StepResult(out)


def tiny_config() -> Gemma3Config:
    return Gemma3Config.from_dict({**TINY_TEXT, "model_type": "gemma3_text"})


def run(requests: list[Request], plan: KVPlan, max_batch: int, budget: int, check=None) -> tuple[dict, Engine]:
    engine = Engine(RecordingBackend(tiny_config()), plan, None, max_batch, budget)
    if check is not None:
        engine.on_step = lambda ids, batch, result: check(engine)
    for r in requests:
        engine.add(r)
    done = {}
    while engine.num_unfinished:
        for c in engine.step():
            assert c.request_id not in done
            done[c.request_id] = c.token_ids
    return done, engine


def check_blocks(engine: Engine) -> None:
    """Every block is either free or held by exactly one running sequence, never both."""
    for name, pool in engine.kv.pools.items():
        held = [b for seq in engine.scheduler.running for b in seq.block_tables.get(name, []) if b >= 0]
        free = list(pool._free)
        assert len(set(held)) == len(held), f"{name}: a block is shared by two sequences"
        assert len(set(free)) == len(free) and not set(free) & set(held)
        assert len(held) + len(free) == pool.num_blocks, f"{name}: a block leaked"
    for seq in engine.scheduler.waiting:
        assert not seq.block_tables and seq.num_cached_tokens == 0


def random_requests(rng: np.random.Generator, n: int) -> list[Request]:
    return [
        Request(i, rng.integers(0, VOCAB, rng.integers(1, 60)).tolist(), SamplingParams(max_tokens=int(rng.integers(1, 30))))
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_finish_identically_under_pressure(seed):
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, 24)
    cfg = tiny_config()
    longest = max(len(r.prompt_ids) + r.params.max_tokens for r in requests)
    alone = {r.request_id: run([r], plan_for(cfg, longest, 1, 64, 4), 1, 64)[0][r.request_id] for r in requests}

    budget = int(rng.integers(8, 40))
    tight = plan_for(cfg, longest, 1, budget, 4)  # room for one longest sequence only
    together, engine = run(requests, tight, max_batch=int(rng.integers(2, 9)), budget=budget, check=check_blocks)
    assert together == alone
    assert all(len(together[r.request_id]) == r.params.max_tokens for r in requests)
    assert sorted(together) == list(range(len(requests)))
    assert all(pool.num_free == pool.num_blocks for pool in engine.kv.pools.values())  # nothing leaked
    assert engine.stats.preemptions > 0  # the tight pool did force preemptions


def plan_for(cfg: Gemma3Config, length: int, seqs: int, max_chunk: int, block_size: int) -> KVPlan:
    blocks = {g.name: seqs * blocks_per_sequence(g, length, block_size, max_chunk) for g in cfg.kv_groups()}
    return KVPlan(block_size, blocks, length, 0, 0, seqs)


def test_a_long_prompt_is_chunked_and_does_not_stall_decoding():
    cfg = tiny_config()
    short = [Request(i, [1, 2, 3], SamplingParams(max_tokens=20)) for i in range(3)]
    long = Request(3, list(range(1, 90)), SamplingParams(max_tokens=2))
    sizes = []

    def watch(engine):
        sizes.append(sum(1 for s in engine.scheduler.running if s.num_completion_tokens > 0))

    _, engine = run(short + [long], plan_for(cfg, 100, 4, 16, 4), max_batch=4, budget=16, check=watch)
    # The 89-token prompt takes 7 steps at <= 16 tokens per step; the 3 short ones decode in all of them.
    assert engine.stats.steps >= 7 and min(sizes[1:7]) == 3


def test_plan_lowers_max_model_len_when_one_sequence_does_not_fit():
    cfg = tiny_config()
    groups = cfg.kv_groups()
    per_token = {g.name: 100 for g in groups}
    plan = plan_kv(groups, per_token, budget_bytes=200_000, block_size=16, max_model_len=100_000, max_batch=8, max_chunk=64)
    assert plan.notice and "lowered" in plan.notice and plan.max_model_len < 100_000
    assert plan.full_length_seqs >= 1 and plan.used_bytes <= 200_000
    roomy = plan_kv(groups, per_token, budget_bytes=10**9, block_size=16, max_model_len=256, max_batch=8, max_chunk=64)
    assert roomy.notice is None and roomy.full_length_seqs == 8  # capped at what max_batch sequences use


@pytest.mark.parametrize("seed", range(6))
def test_scheduling_ahead_finishes_identically_with_stops_and_late_requests(seed):
    """`Engine.schedule_ahead` (the next one or two steps scheduled and submitted while the
    backend runs this one, the tokens they need still being sampled fed from the step before:
    `StepBatch.token_sources`) against scheduling after each step: the same completions and
    finish reasons, with stop tokens ending sequences early (the steps ahead then still hold
    them; their K/V writes go to freed blocks), requests added between steps, and a pool tight
    enough to preempt (a sequence preempted with tokens still being sampled waits for them).
    RecordingBackend fails on any wrong block or slot, so a stale write read by the blocks' next
    owner would fail it; every step leaves the blocks consistent and nothing leaks."""
    rng = np.random.default_rng(100 + seed)
    stops = frozenset(rng.choice(VOCAB, 4, replace=False).tolist())
    requests = [Request(r.request_id, r.prompt_ids, r.params, stops) for r in random_requests(rng, 20)]
    cfg = tiny_config()
    longest = max(len(r.prompt_ids) + r.params.max_tokens for r in requests)
    budget, max_batch = int(rng.integers(8, 40)), int(rng.integers(2, 9))
    results = []
    for ahead in (0, 1, 2):
        backend = RecordingBackend(cfg)
        engine = Engine(backend, plan_for(cfg, longest, 1, budget, 4), None, max_batch, budget,
                        schedule_ahead=ahead)
        fed = 0  # tokens taken from the step before, on the device's side of the contract
        step = backend.step

        def counting_step(batch):
            nonlocal fed
            fed += 0 if batch.token_sources is None else int((batch.token_sources >= 0).sum())
            return step(batch)

        backend.step = counting_step
        depth = []
        submit = backend.submit
        backend.submit = lambda batch: (submit(batch), depth.append(len(backend._submitted)))
        pending, done, steps = list(requests), {}, 0
        for r in pending[:8]:
            engine.add(r)
        pending = pending[8:]
        while engine.num_unfinished or pending:
            if pending and (steps % 3 == 0 or not engine.num_unfinished):
                engine.add(pending.pop(0))
            for c in engine.step():
                assert c.request_id not in done
                done[c.request_id] = (c.token_ids, c.finish_reason)
            check_blocks(engine)
            steps += 1
        assert all(pool.num_free == pool.num_blocks for pool in engine.kv.pools.values())
        assert (fed > 0) == (ahead > 0) and max(depth) == ahead + 1  # steps in flight at once
        results.append((done, engine.stats.preemptions))
    (sync, _), *ahead = results
    for done, preemptions in ahead:
        assert done == sync and sorted(done) == list(range(len(requests)))
        assert preemptions > 0
    assert any(reason == "stop" for _, reason in sync.values())  # some sequences stopped early


@pytest.mark.parametrize("value, ahead", [(None, 2), ("", 2), (" 1 ", 1), ("0", 0), ("off", ValueError)])
def test_steps_ahead_from_the_environment(monkeypatch, value, ahead):
    """GEMMA_BATCH_SCHEDULE_AHEAD: a count of steps; unset or empty is the default (2), a word is
    refused, not read as a switch."""
    cfg = tiny_config()
    if value is None:
        monkeypatch.delenv(AHEAD_ENV, raising=False)
    else:
        monkeypatch.setenv(AHEAD_ENV, value)
    overlapping = type("Overlapping", (RecordingBackend,), {"overlaps": True})  # as the Vulkan backend
    make = lambda: Engine(overlapping(cfg), plan_for(cfg, 8, 2, 16, 4), None, 2, 16)  # noqa: E731
    if ahead is ValueError:
        with pytest.raises(ValueError, match="GEMMA_BATCH_SCHEDULE_AHEAD='off'"):
            make()
    else:
        assert make().schedule_ahead == ahead


def test_a_steps_prefill_tokens_count_when_it_is_waited_for():
    """With steps submitted ahead, one `step` call submits several prefill steps and waits for the
    first: the stats (and so the bench's prefill tokens/s, which divides each call's prefill tokens
    by its wall time) count only the steps waited for so far."""
    cfg = tiny_config()
    prompt = 40
    requests = [Request(i, list(range(1, prompt + 1)), SamplingParams(max_tokens=3)) for i in range(2)]
    backend = RecordingBackend(cfg)
    engine = Engine(backend, plan_for(cfg, prompt + 3, 2, 16, 4), None, 2, 16, schedule_ahead=2,
                    prefix_cache=False)  # (both prompts computed)
    submitted = []
    submit = backend.submit
    backend.submit = lambda batch: (submitted.append(int((batch.positions < prompt).sum())), submit(batch))
    for r in requests:
        engine.add(r)
    counted, calls = [], 0
    while engine.num_unfinished:
        engine.step()
        calls += 1
        counted.append(engine.stats.prefill_tokens)
        assert counted[-1] == sum(submitted[:calls])  # the prompt tokens of the steps waited for
    assert len(submitted) > 3 and counted[0] == 16 and counted[-1] == 2 * prompt


@pytest.mark.parametrize("prompt_len, small_step, want", [(12, 6, [6] * 4), (12, None, [15]), (40, 6, [16] * 3)])
def test_prompts_beside_a_full_batch_are_fed_in_small_steps(prompt_len, small_step, want):
    """A backend's `small_step` caps the steps in which at least half the batch decodes: a
    12-token prompt joining 3 decoding sequences (max batch 4) goes in 4 steps of 6 tokens (3 of
    it each) instead of one of 15; a 40-token prompt, more than SMALL_STEP_ROUNDS such steps
    would feed, still goes in steps of the whole budget of 16; and so does a prompt joining a
    lone decoding sequence. The completions do not depend on it."""
    assert SMALL_STEP_ROUNDS == 4  # (the cases above are cut to it)
    cfg = tiny_config()
    backend = RecordingBackend(cfg)
    backend.small_step = small_step
    requests = [Request(i, [1, 2, 3], SamplingParams(max_tokens=30)) for i in range(3)]
    requests.append(Request(3, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=2)))

    def feed(decoding: list[Request], joining: Request) -> tuple[list[tuple[int, int]], dict]:
        engine = Engine(backend, plan_for(cfg, 100, 4, 16, 4), None, max_batch=4, step_token_budget=16)
        fed = []
        engine.on_step = lambda ids, batch, result: fed.append((batch.num_tokens, len(ids)))
        for r in decoding:
            engine.add(r)
        done = {}
        for _ in range(2):
            done.update((c.request_id, c.token_ids) for c in engine.step())
        fed.clear()
        engine.add(joining)
        while engine.num_unfinished:
            done.update((c.request_id, c.token_ids) for c in engine.step())
        return fed, done

    fed, done = feed(requests[:3], requests[3])
    assert [tokens for tokens, seqs in fed if seqs == 4 and tokens > 4] == want  # (a last chunk's step may have 4)
    assert done == run(requests, plan_for(cfg, 100, 4, 16, 4), max_batch=4, budget=16)[0]
    fed, _ = feed(requests[:1], requests[3])  # a lone decoding sequence
    assert fed[0] == (min(16, 1 + prompt_len), 2)
