"""Batch invariance on every backend: a row's tokens do not depend on what runs beside it.

The same rows (greedy and sampled, prompts crossing the demo model's 64-token sliding window)
run alone, all together, and shuffled with another step budget and a KV pool small enough to
force preemptions; every row's completion must be identical, token for token.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from gemma_batch.backends import create_backend
from gemma_batch.backends.base import Backend
from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.backends.cpu_math import matmul_rows
from gemma_batch.backends.cpu_attention import AttentionPlan, attend, attend_tiles
from gemma_batch.backends.kv_formats import KVStore
from gemma_batch.engine.engine import Engine, Request
from gemma_batch.engine.kv_plan import KVPlan, blocks_per_sequence
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint, to_float32
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat, quantize

# (llvmpipe takes about a second a step in CI: fewer rows and tokens there (6 new), the first 4 prompts
# of the 12, 2 of them sampled, and still preempted in the squeezed run)
NEW_TOKENS = {"cpu": 24, "vulkan": 6}
ROWS = {"cpu": 12, "vulkan": 4}


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def backend(request) -> Backend:
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    backend = create_backend(request.param, cfg)
    backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    return backend


def make_requests(cfg: Gemma3Config, new_tokens: int, rows: int = 12) -> list[Request]:
    rng = np.random.default_rng(1)
    requests = []
    for i in range(rows):
        params = SamplingParams(max_tokens=new_tokens, seed=5)
        if i % 3:
            params = SamplingParams(max_tokens=new_tokens, temperature=0.9, top_k=200 * (i % 2), top_p=0.95, seed=5)
        prompt = [2, *rng.integers(3, cfg.vocab_size, int(rng.integers(4, 90))).tolist()]
        requests.append(Request(i, prompt, params, frozenset(), params.rng_key(f"row-{i}"), new_tokens))
    return requests


def run(
    backend: Backend, requests: list[Request], max_batch: int, budget: int, seqs_in_pool: int, logits: dict | None = None
) -> tuple[dict, int]:
    """Completions by request id, and preemptions; `logits` collects (request, position) -> logits bytes."""
    length = max(len(r.prompt_ids) + r.max_new_tokens for r in requests)
    bs = 8
    blocks = {g.name: seqs_in_pool * blocks_per_sequence(g, length, bs, budget) for g in backend.cfg.kv_groups()}

    def record(ids, batch, result):
        for s, request_id in enumerate(ids):
            for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
                logits[request_id, int(batch.positions[t])] = result.logits[t].tobytes()

    plan = KVPlan(bs, blocks, length, 0, 0, seqs_in_pool)
    engine = Engine(backend, plan, None, max_batch, budget, record if logits is not None else None)
    for r in requests:
        engine.add(r)
    out = {}
    while engine.num_unfinished:
        out.update((c.request_id, c.token_ids) for c in engine.step())
    return out, engine.stats.preemptions


def test_rows_are_identical_alone_together_and_shuffled_with_preemption(backend):
    requests = make_requests(backend.cfg, NEW_TOKENS[backend.name], ROWS[backend.name])
    logits_alone, logits_together, logits_squeezed = {}, {}, {}
    alone = {r.request_id: run(backend, [r], 1, 512, 1, logits_alone)[0][r.request_id] for r in requests}
    together, _ = run(backend, requests, 32, 64, len(requests), logits_together)
    shuffled = [requests[i] for i in np.random.default_rng(2).permutation(len(requests))]
    squeezed, preemptions = run(backend, shuffled, 8, 17, 2, logits_squeezed)
    assert preemptions > 0
    assert together == alone
    assert squeezed == alone
    # Tokens rarely flip on a last-bit difference; the logits show any: they must be bit-identical
    # (after a preemption, recomputed positions must reproduce the first computation too).
    assert logits_together == logits_alone
    assert {k: v for k, v in logits_squeezed.items() if k in logits_alone} == logits_alone
    sampled = [r.request_id for r in requests if r.params.temperature > 0]
    greedy_twin = {**requests[sampled[0]].__dict__, "params": SamplingParams(max_tokens=NEW_TOKENS[backend.name])}
    assert run(backend, [Request(**greedy_twin)], 1, 512, 1)[0][sampled[0]] != alone[sampled[0]]  # sampling is live


@pytest.mark.parametrize("shape", [(96, 64), (128, 128), (192, 128), (384, 128), (2048, 128), (2304, 1152),
                                   (16448, 64)])
def test_row_tiled_products_do_not_depend_on_the_other_rows(shape):
    """Also with the products' blocks on threads (`block_rows`: one to nine blocks of output rows
    here, and the last shape's 17 of the larger size); BLAS on one thread, as the CPU backend runs
    its steps (with two threads OpenBLAS sums some shapes in another order, so the count is fixed)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal((40, shape[1])).astype(np.float32)
    with ThreadpoolController().limit(limits=1, user_api="blas"):
        alone = np.stack([matmul_rows(x[i : i + 1], w)[0] for i in range(40)])
        with ThreadPoolExecutor(3) as pool:
            for n in (1, 2, 7, 16, 17, 40):
                assert np.array_equal(matmul_rows(x[:n], w), alone[:n])
                assert np.array_equal(matmul_rows(x[:n], w, pool), alone[:n])
        perm = rng.permutation(40)
        assert np.array_equal(matmul_rows(x[perm], w), alone[perm])


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("window", [None, 64, 40])
def test_attention_reads_keys_once_or_per_query_with_the_same_bits(kv_dtype, window):
    """A sequence with many queries in a step reads its keys once and views each query's window
    in them; the same queries copying their windows one by one must give the same bits, and so must
    the queries in pieces on threads (`attend_tiles`). Prompts cross the window (40 is not a
    multiple of the 64-key bucket: the copying path runs there)."""
    rng = np.random.default_rng(3)
    cfg = dataclasses.replace(Gemma3Config.from_dir(DEMO_MODEL), num_heads=4, num_kv_heads=2)
    bs, blocks = 8, 64
    k_cache, v_cache = (KVStore(kv_dtype, blocks * bs, 2, cfg.head_dim) for _ in range(2))
    for store in (k_cache, v_cache):
        store.write(np.arange(blocks * bs), rng.standard_normal((blocks * bs, 2, cfg.head_dim)).astype(np.float32))
    table = rng.permutation(blocks).reshape(4, 16)  # 4 sequences of up to 128 positions
    runs = [(0, 0, 100), (1, 30, 120), (2, 90, 91), (3, 5, 13)]  # (sequence, first position, end)
    seqs = np.concatenate([np.full(e - p, s) for s, p, e in runs])
    positions = np.concatenate([np.arange(p, e) for _, p, e in runs])
    lo = np.zeros_like(positions) if window is None else np.maximum(0, positions - window + 1)
    plan = AttentionPlan(seqs, positions, lo, table, bs)
    q = rng.standard_normal((len(seqs), 4, cfg.head_dim)).astype(np.float32)
    once = attend(q, k_cache, v_cache, plan, cfg)
    copied = attend(q, k_cache, v_cache, plan, cfg, run_min=1 << 30)
    assert np.array_equal(once, copied)
    assert np.isfinite(once).all()
    with ThreadPoolExecutor(3) as pool:  # in pieces on threads, runs cut anywhere (a piece of 5 holds no long run)
        for tile in (16, 5):
            assert np.array_equal(attend_tiles(pool, q, k_cache, v_cache, plan, cfg, tile), once)


@pytest.mark.parametrize("weights", ["fp32", "int4"])
def test_cpu_threads_do_not_change_the_bits(weights):
    """One thread, or three taking parts of each step's rows (steps of 3+ tiles) or else the blocks
    and attention tiles of a step (2 tiles), give every position's logits bit for bit (the tests'
    machine may have one core: the count is forced); int4 layer matrices too, whose blocks the
    three widen together (cpu_parts.SharedWidening)."""
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    requests = make_requests(cfg, NEW_TOKENS["cpu"])
    tensors = list(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    if weights == "int4":
        tensors = [(name, quantize(to_float32(t), WeightFormat.parse("int4")) if name.endswith("_proj.weight") else t)
                   for name, t in tensors]
    logits = []
    for threads in (1, 3):
        backend = CpuBackend(cfg, threads=threads)
        backend.load_weights(tensors)
        logits.append({})
        run(backend, requests, 32, 512, len(requests), logits[-1])
    assert logits[0] == logits[1] and len(logits[0]) > 300
