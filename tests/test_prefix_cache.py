"""Prefix caching: the block pool's bookkeeping, which blocks a new prompt may start from (global
and sliding-window groups), and, on every backend, completions and logits bit-identical with
and without the cache (greedy and sampled rows, prefixes shorter and longer than the sliding
window, ending mid-block, several prefixes, a pool small enough to evict and preempt)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from gemma_batch.backends.base import Backend
from gemma_batch.engine.block_pool import BlockPool, block_keys
from gemma_batch.engine.engine import Engine, Request
from gemma_batch.engine.kv_cache import KVCacheManager
from gemma_batch.engine.kv_plan import KVPlan, blocks_per_sequence
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.engine.sequence import Sequence
from gemma_batch.model.config import Gemma3Config, KVGroup
from tests.demo_engine import demo_cpu
from tests.test_batch_invariance import backend  # noqa: F401 (the fixture: the demo model on every backend)
from tests.test_run_job import gemma_batch, read_rows, write_jsonl

NEW_TOKENS = 6
BS = 8


def test_block_keys_chain_over_the_whole_prefix():
    a = block_keys(list(range(40)), 8, 5, b"seed")
    b = block_keys([99] + list(range(1, 40)), 8, 5, b"seed")
    assert len(a) == 5 and len(set(a)) == 5
    assert all(x != y for x, y in zip(a, b))  # one token differing in block 0 changes every later key
    assert block_keys(list(range(40)), 8, 5, b"other") != a  # the seed (model, arithmetic) is in every key
    assert block_keys(list(range(24)) + [7] * 16, 8, 3, b"seed") == a[:3]


def test_pool_hands_out_uncached_blocks_first_then_the_oldest_cached():
    pool = BlockPool(4)
    blocks = [pool.allocate() for _ in range(4)]
    assert pool.num_free == 0
    with pytest.raises(RuntimeError):
        pool.allocate()
    pool.register(blocks[0], b"k0")
    pool.register(blocks[1], b"k1")
    pool.register(blocks[2], b"k0")  # another block with the same content: the first stays the cached one
    assert pool.lookup(b"k0") == blocks[0] and pool.num_cached == 2
    for b in (blocks[1], blocks[0], blocks[2], blocks[3]):
        pool.release(b)
    assert pool.num_free == 4
    assert [pool.allocate(), pool.allocate()] == [blocks[3], blocks[2]]  # uncached, newest freed first
    pool.take(pool.lookup(b"k0"))  # a hit on a free cached block takes it off the free list
    assert pool.num_free == 1 and not pool.is_free(blocks[0])
    assert pool.allocate() == blocks[1] and pool.evictions == 1 and pool.lookup(b"k1") is None
    pool.take(blocks[0])  # a second holder
    pool.release(blocks[0])
    assert not pool.is_free(blocks[0])
    pool.release(blocks[0])
    assert pool.is_free(blocks[0]) and pool.lookup(b"k0") == blocks[0]  # free, still cached


GROUPS = (KVGroup("full", (0,), None), KVGroup("sliding", (1,), 20))


def computed(kv: KVCacheManager, prompt: list[int], seq_id: int = 0) -> Sequence:
    """A sequence whose whole prompt was fed (in one step) and registered."""
    seq = Sequence.from_prompt(seq_id, prompt, 4)
    kv.allocate(seq, len(prompt))
    seq.num_cached_tokens = len(prompt)
    kv.register(seq)
    kv.release_out_of_window(seq)
    return seq


def test_a_hit_takes_every_global_block_but_only_the_last_window_of_sliding_ones():
    kv = KVCacheManager(GROUPS, {"full": 64, "sliding": 64}, 4, b"seed")
    prefix = list(range(100, 150))  # 50 tokens: 12 full blocks
    first = computed(kv, prefix + [1, 2, 3])
    assert first.block_tables["sliding"][:8] == [-1] * 8  # left the window (20 tokens) of position 53
    twin = Sequence.from_prompt(1, prefix + [7, 8, 9, 10, 11], 4)
    hit = kv.find_prefix(twin)
    assert hit.num_tokens == 48  # 12 blocks; block 13 differs
    assert hit.tables["full"] == first.block_tables["full"][:12]
    # a query at 48 sees positions 29..47: blocks 7..11; block 7 left `first`'s window (at 53) and was
    # released, but stays cached while no one needs its memory
    assert hit.tables["sliding"][:7] == [-1] * 7 and hit.tables["sliding"][7] >= 0
    assert hit.tables["sliding"][8:] == first.block_tables["sliding"][8:12]
    assert hit.num_free == {"full": 0, "sliding": 1}  # block 7 is cached but free
    kv.take_prefix(twin, hit)
    kv.allocate(twin, twin.num_prompt_tokens)
    assert twin.num_cached_tokens == 48 and twin.num_prompt_tokens_hit == 48
    assert twin.block_tables["full"][:12] == first.block_tables["full"][:12]

    whole = Sequence.from_prompt(2, prefix[:48], 4)  # a prompt that is all cached blocks: the last one is fed again
    assert kv.find_prefix(whole).num_tokens == 44


def test_a_missing_sliding_block_inside_the_window_shortens_the_hit():
    kv = KVCacheManager(GROUPS, {"full": 64, "sliding": 64}, 4, b"seed")
    prefix = list(range(100, 150))
    first = computed(kv, prefix + [1, 2, 3])
    sliding = kv.pools["sliding"]
    lost = first.block_tables["sliding"][10]
    key = sliding._key_of.pop(lost)  # as if evicted
    del sliding._by_key[key]
    hit = kv.find_prefix(Sequence.from_prompt(1, prefix + [5, 6, 7, 8], 4))
    assert hit.num_tokens == 40  # a hit at 44 or 48 would read block 10 in the sliding layers
    assert hit.tables["sliding"][:5] == [-1] * 5 and hit.tables["full"] == first.block_tables["full"][:10]
    off = KVCacheManager(GROUPS, {"full": 64, "sliding": 64}, 4, None)
    computed(off, prefix + [1, 2, 3])
    assert off.find_prefix(Sequence.from_prompt(1, prefix + [5], 4)).num_tokens == 0  # caching off


@pytest.fixture(scope="module")
def cpu_backend() -> Backend:
    return demo_cpu()[0]


def shared_prefix_requests(cfg: Gemma3Config, rows: int = 9) -> list[Request]:
    """Rows over three prefixes: 43 tokens (within the demo model's 128-token window, ending
    mid-block), 203 (past the window) and 16 (one block); items of 1 to 30 tokens, one row whose
    prompt is another's whole, greedy and sampled rows."""
    rng = np.random.default_rng(7)
    prefixes = [[2, *rng.integers(3, cfg.vocab_size, n - 1).tolist()] for n in (43, 203, 16)]
    requests = []
    for i in range(rows):
        prompt = prefixes[i % 3] + rng.integers(3, cfg.vocab_size, int(rng.integers(1, 31))).tolist()
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.8 if i % 2 else 0.0, top_p=0.9, seed=3)
        requests.append(Request(i, prompt, params, frozenset(), params.rng_key(f"row-{i}"), NEW_TOKENS))
    requests.append(Request(rows, list(requests[4].prompt_ids), requests[4].params, frozenset(), (9, 9), NEW_TOKENS))
    return requests


def run(backend: Backend, requests: list[Request], prefix_cache: bool, seqs_in_pool: int, max_batch: int = 8,
        budget: int = 256):
    """Completions by id, every fed position's logits, and the engine (for its stats and pools)."""
    length = max(len(r.prompt_ids) for r in requests) + NEW_TOKENS
    blocks = {g.name: seqs_in_pool * blocks_per_sequence(g, length, BS, budget) for g in backend.cfg.kv_groups()}
    logits = {}

    def record(ids, batch, result):
        for s, request_id in enumerate(ids):
            for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
                logits[request_id, int(batch.positions[t])] = result.logits[t].tobytes()

    engine = Engine(backend, KVPlan(BS, blocks, length, 0, 0, seqs_in_pool), None, max_batch, budget, record,
                    prefix_cache=prefix_cache)
    for r in requests:
        engine.add(r)
    out = {}
    while engine.num_unfinished:
        out.update((c.request_id, (c.token_ids, c.cached_prompt_tokens)) for c in engine.step())
    return out, logits, engine


def test_rows_are_bit_identical_with_and_without_the_prefix_cache(backend):
    requests = shared_prefix_requests(backend.cfg, 9 if backend.name == "cpu" else 5)  # (llvmpipe: ~20 tok/s)
    plain, plain_logits, _ = run(backend, requests, False, len(requests))
    cached, cached_logits, engine = run(backend, requests, True, len(requests))
    assert {i: t for i, (t, _) in cached.items()} == {i: t for i, (t, _) in plain.items()}
    # Every position fed in both runs gives the same logits, bit for bit (cached positions are fed once)
    assert len(cached_logits) < len(plain_logits)
    assert all(plain_logits[k] == v for k, v in cached_logits.items())
    hits = {i: c for i, (_, c) in cached.items()}
    assert all(c == 0 for _, c in plain.values())
    assert hits[len(requests) - 1] == (len(requests[4].prompt_ids) - 1) // BS * BS  # whole prompt cached: last block fed again
    assert sorted(i for i, h in hits.items() if h) == list(range(3, len(requests)))  # all but each prefix's first (siblings waited)
    stats = engine.stats
    assert stats.prompt_tokens_cached == sum(hits.values())
    assert stats.prompt_tokens_computed == stats.prompt_tokens - stats.prompt_tokens_cached  # none computed twice


def test_a_small_pool_evicts_and_preempts_and_the_rows_stay_identical(cpu_backend):
    """(What is backend-specific, a prompt that starts from blocks others computed, the test above
    checks on every backend; this one runs the bookkeeping under pressure.)"""
    requests = shared_prefix_requests(cpu_backend.cfg)
    plain, plain_logits, _ = run(cpu_backend, requests, False, len(requests))
    squeezed, squeezed_logits, engine = run(cpu_backend, requests[::-1], True, 1, max_batch=4, budget=64)
    assert {i: t for i, (t, _) in squeezed.items()} == {i: t for i, (t, _) in plain.items()}
    assert all(plain_logits[k] == v for k, v in squeezed_logits.items())
    assert engine.stats.preemptions > 0
    assert sum(pool.evictions for pool in engine.kv.pools.values()) > 0
    assert engine.stats.prompt_tokens_cached > 0
    assert all(pool.num_free == pool.num_blocks for pool in engine.kv.pools.values())  # nothing leaked


INSTRUCTION = ("Label the sentiment of the review as positive, negative or neutral. Answer with one word. "
               "Reviews may mention price, delivery, quality and service; weigh them all. ")


def labelling_rows(n: int, instruction_repeats: tuple[int, ...], item_words: int) -> list[dict]:
    """Rows whose prompts start with one of a few shared instructions (by repeat count), then an item."""
    rows = []
    for i in range(n):
        k = i % len(instruction_repeats)
        instruction = f"Task {k}. " + INSTRUCTION * instruction_repeats[k]
        item = " ".join(f"word{(i * 7 + j) % 50}" for j in range(item_words))
        row = {"id": f"r{i}", "prompt": f"{instruction}Review {i}: {item}. Label:"}
        if i % 2:
            row["temperature"] = 0.8  # sampled rows beside greedy ones
        rows.append(row)
    return rows


def test_jobs_with_and_without_the_prefix_cache_write_the_same_rows(tmp_path):
    """Several instructions (shorter and longer than the demo model's 128-token window), greedy and
    sampled rows; also with a KV budget so small that cached blocks are evicted (in steps of 512
    tokens: in the CPU's default 8,192 the evicted blocks were not asked for again)."""
    data = write_jsonl(tmp_path / "rows.jsonl", labelling_rows(24, (1, 4, 7), 6))
    outputs = {}
    for name, flags in {"plain": ["--no-prefix-cache"], "cached": [], "tight": ["--kv-memory", "3MiB", "--max-step-tokens", "512"]}.items():
        done = gemma_batch("run", data, "--max-tokens", "6", "--seed", "3", "--output", tmp_path / f"{name}.parquet",
                           "--backend", "cpu", *flags, timeout=300)  # (the budget's blocks depend on the backend's KV)
        assert done.returncode == 0, done.stderr
        outputs[name] = pq.read_table(tmp_path / f"{name}.parquet")
        outputs[name + " stats"] = pq.read_table(tmp_path / f"{name}.stats.parquet").to_pylist()[0]
    plain = outputs["plain"].drop(["cached_prompt_tokens"])
    for name in ("cached", "tight"):
        assert outputs[name].drop(["cached_prompt_tokens"]).equals(plain), name
    cached = outputs["cached"].column("cached_prompt_tokens").to_pylist()
    assert cached[:3] == [0, 0, 0] and all(c > 0 for c in cached[3:])  # each instruction computed once
    assert set(outputs["plain"].column("cached_prompt_tokens").to_pylist()) == {0}
    stats = outputs["cached stats"]
    assert stats["prompt_tokens_cached"] == sum(cached) and stats["prefix_hit_rate"] > 0.5
    assert stats["prompt_tokens_computed"] == stats["prompt_tokens"] - stats["prompt_tokens_cached"]
    tight = outputs["tight stats"]
    assert tight["prefix_evictions"] > 0 and 0 < tight["prompt_tokens_cached"] < stats["prompt_tokens_cached"]


def test_a_shared_instruction_of_a_thousand_tokens_is_computed_once(tmp_path):
    """The labelling shape (a ~1,000-token instruction, a ~100-token item) on the CPU: at most 15% of
    the prompt tokens are computed; the progress line shows the hit rate."""
    data = write_jsonl(tmp_path / "rows.jsonl", labelling_rows(40, (17,), 30))
    done = gemma_batch("run", data, "--max-tokens", "4", "--backend", "cpu", timeout=300)
    assert done.returncode == 0, done.stderr
    rows = read_rows(tmp_path / "rows.jsonl.completions.parquet")
    assert 1000 <= rows[0]["prompt_tokens"] <= 1300
    stats = pq.read_table(tmp_path / "rows.jsonl.completions.stats.parquet").to_pylist()[0]
    assert stats["prompt_tokens_computed"] <= 0.15 * stats["prompt_tokens"]
    assert "prefix cache" in done.stderr and "from the prefix cache" in done.stdout
