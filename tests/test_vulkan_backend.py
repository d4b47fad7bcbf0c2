"""The Vulkan backend against the CPU reference, on tiny transformers-written checkpoints.

In CI this runs on Mesa's llvmpipe; on a GPU machine on the GPU (GEMMA_BATCH_VK_DEVICE picks).

Tolerances, on logits (max abs; the tiny models' logits reach about 3):
- KV pages fp32: 1e-4. Both backends use the same weights (bf16/fp32 widened exactly) and fp32
  everywhere; only summation orders differ (fused norms, subgroup sums, online softmax, the merge
  of attention chunks), worth a few 1e-6, as between the CPU backend and transformers (same bound
  as that test).
- KV pages fp16 (the default): 1e-2. Rounding K and V to fp16 moves each by up to 2^-11
  relative (4.9e-4); through six layers that measured 1.6e-3 on these models. Every modelling
  mistake moves logits by 1e-1 or more (the negative control below fails by > 10x).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.attention import DEFAULT_CHUNK, chunk_counts
from gemma_batch.engine.engine import Engine, Request
from gemma_batch.engine.generate import generate_greedy
from gemma_batch.engine.kv_plan import KVPlan
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from tests.test_cpu_vs_transformers import PROMPTS, NEW_TOKENS, checkpoints, cpu_backend, run_batched  # noqa: F401

TOL = {"fp32": 1e-4, "fp16": 1e-2}


def vulkan_backend(model_dir, kv_dtype: str = "fp16", attention_chunk: int = DEFAULT_CHUNK,
                   **config_changes) -> VulkanBackend:
    cfg = Gemma3Config.from_dir(model_dir)
    backend = VulkanBackend(dataclasses.replace(cfg, **config_changes), kv_dtype=kv_dtype, attention_chunk=attention_chunk)
    backend.load_weights(Checkpoint.open(model_dir, cfg).tensors())
    return backend


@pytest.fixture(scope="module")
def cpu_runs(checkpoints):
    """CPU reference completions and logits per checkpoint, prefill chunked to 7 tokens."""
    return {layout: run_batched(cpu_backend(checkpoints[layout][0]), step_token_budget=7) for layout in ("causal", "bf16")}


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["causal", "bf16"])  # F32 and BF16 weights
def test_logits_and_greedy_tokens_match_the_cpu_backend(checkpoints, cpu_runs, layout, kv_dtype):
    """4 prompts (3 to 29 tokens, window 8) together, prefill in 7-token chunks mixed with decode."""
    completions, logits = run_batched(vulkan_backend(checkpoints[layout][0], kv_dtype), step_token_budget=7)
    ref_completions, ref_logits = cpu_runs[layout]
    assert completions == ref_completions
    for ours, ref in zip(logits, ref_logits):
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() < TOL[kv_dtype]


def test_greedy_tokens_match_with_forced_preemption_and_tiny_pools(checkpoints, cpu_runs):
    """Four prompts, batch of 3, 4-token blocks for about two sequences: sequences are preempted
    and recomputed, sliding blocks recycled; the tokens still equal the CPU backend's."""
    backend = vulkan_backend(checkpoints["bf16"][0])
    plan = KVPlan(4, {"full_attention": 24, "sliding_attention": 10}, 64, 0, 0, 1)
    engine = Engine(backend, plan, None, max_batch=3, step_token_budget=5)
    for i, prompt in enumerate(PROMPTS):
        engine.add(Request(i, prompt, SamplingParams(max_tokens=NEW_TOKENS)))
    completions = {}
    while engine.num_unfinished:
        completions.update((c.request_id, c.token_ids) for c in engine.step())
    assert engine.stats.preemptions > 0
    assert [completions[i] for i in range(len(PROMPTS))] == cpu_runs["bf16"][0]


SAMPLED = [  # one request per prompt: each filter, and one greedy row among them
    SamplingParams(max_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=1),
    SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, top_k=5, seed=2),
    SamplingParams(max_tokens=NEW_TOKENS, temperature=1.2, min_p=0.05, seed=3),
    SamplingParams(max_tokens=NEW_TOKENS),
]


def engine_tokens(backend, params: list[SamplingParams], **engine_args) -> list[list[int]]:
    plan = KVPlan(4, {"full_attention": 64, "sliding_attention": 24}, 64, 0, 0, 1)
    engine = Engine(backend, plan, None, **engine_args)
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        engine.add(Request(i, prompt, p))
    done = {}
    while engine.num_unfinished:
        done.update((c.request_id, c.token_ids) for c in engine.step())
    return [done[i] for i in range(len(PROMPTS))]


def test_sampled_generations_match_the_cpu_backend(checkpoints, cpu_runs):
    """Temperature, top-p, top-k and min-p rows with the engine's counter-based draws, mixed with
    a greedy row, prefill chunked: the on-device sampler picks the CPU backend's tokens. fp32 KV
    keeps logits within ~5e-6 of the CPU's, so no draw lands that close to a CDF boundary."""
    model_dir = checkpoints["bf16"][0]
    ours = engine_tokens(vulkan_backend(model_dir, "fp32"), SAMPLED, max_batch=4, step_token_budget=7)
    ref = engine_tokens(cpu_backend(model_dir), SAMPLED, max_batch=4, step_token_budget=7)
    assert ours == ref
    assert ours[3] == cpu_runs["bf16"][0][3]  # the greedy row
    assert all(ours[i] != cpu_runs["bf16"][0][i] for i in range(3))  # the sampled rows did sample


def test_steps_submitted_ahead_give_the_cpu_completions_with_stops_and_late_requests(checkpoints, cpu_runs):
    """The engine submits the next one or two steps while one runs (two: the default on this
    backend, its three input sets in turn), the tokens being sampled fed on the device: with stop
    tokens ending sequences while the steps ahead still hold them, requests added later (a longer
    prompt, so the step buffers grow with steps in flight: `reserve` is switched off to make
    them), and sampled rows, the completions are the CPU backend's, run one step at a time. Stops
    are tokens the greedy rows produce midway (so they do stop early)."""
    model_dir = checkpoints["bf16"][0]
    greedy = cpu_runs["bf16"][0]
    stops = frozenset({greedy[0][3], greedy[2][5]})
    requests = [Request(i, prompt, p, stops) for i, (prompt, p) in enumerate(zip(PROMPTS, SAMPLED))]
    requests += [Request(4 + i, prompt * 3, SamplingParams(max_tokens=NEW_TOKENS), stops)
                 for i, prompt in enumerate(PROMPTS)]

    def run(backend, ahead: int) -> dict[int, tuple[list[int], str]]:
        plan = KVPlan(4, {"full_attention": 160, "sliding_attention": 48}, 256, 0, 0, 1)
        engine = Engine(backend, plan, None, max_batch=4, step_token_budget=64, schedule_ahead=ahead)
        for r in requests[:4]:
            engine.add(r)
        done, steps = {}, 0
        while engine.num_unfinished or steps < 6:
            if steps == 5:
                for r in requests[4:]:
                    engine.add(r)
            done.update((c.request_id, (c.token_ids, c.finish_reason)) for c in engine.step())
            steps += 1
        return done

    backend = vulkan_backend(model_dir, "fp32")
    backend.reserve = lambda *args: None  # the engine would size the buffers for the whole plan
    fed, depth = [], []
    submit = backend.submit
    backend.submit = lambda batch: (fed.append(0 if batch.token_sources is None else int((batch.token_sources >= 0).sum())),
                                    submit(batch), depth.append(len(backend._in_flight)))[1]
    ref = run(cpu_backend(model_dir), 0)
    assert sorted(ref) == list(range(len(requests)))
    assert sum(reason == "stop" for _, reason in ref.values()) >= 2
    for ahead in (1, 2):
        fed.clear(), depth.clear()
        assert run(backend, ahead) == ref
        assert sum(fed) > 0  # tokens did come from the step before, on the device
        assert max(depth) == ahead + 1  # steps in flight at once
        assert not backend._in_flight


def test_the_engine_sizes_the_step_buffers_once_for_its_plan(checkpoints):
    """`Engine` makes the backend reserve room for every step its plan allows (`Backend.reserve`),
    so prompts that grow up to the plan's max_model_len run without the step buffers growing
    mid-run (each growth records every step again: about 2 s on a real model). Negative control:
    without the reservation the same requests grow them."""
    model_dir = checkpoints["bf16"][0]
    backend = vulkan_backend(model_dir, "fp32")
    grown = []
    ensure = backend._ensure
    backend._ensure = lambda need: (grown.append(need), ensure(need))[1]
    prompts = [PROMPTS[0], PROMPTS[1] * 3, (PROMPTS[2] * 40)[:200]]

    def run() -> dict[int, list[int]]:
        plan = KVPlan(4, {"full_attention": 160, "sliding_attention": 48}, 256, 0, 0, 1)
        engine = Engine(backend, plan, None, max_batch=4, step_token_budget=64, schedule_ahead=0)
        grown.clear()
        for i, prompt in enumerate(prompts):
            engine.add(Request(i, prompt, SamplingParams(max_tokens=8)))
        done = {}
        while engine.num_unfinished:
            done.update((c.request_id, c.token_ids) for c in engine.step())
        return done

    reserved = run()
    assert not grown
    backend.reserve = lambda *args: None
    backend._drop_graph()  # as a fresh backend: no step buffers (the same plan would keep them)
    assert run() == reserved
    assert len(grown) >= 2  # the first step, then the 200-token prompt's wider block tables


def test_a_profiled_step_times_each_dispatch_in_recorded_order(checkpoints):
    """With `profile`, a step's GPU time comes per dispatch in the order recorded
    (`profile_timeline`): the embedding first, then each layer's dispatches with its attention
    (attention.comp; prompt tokens' flash attention aside) once, the sampler last;
    `profile_seconds` is the same times summed per kernel. Without
    `profile`, one "step"."""
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    backend = VulkanBackend(cfg, kv_dtype="fp16", profile=True)
    backend.load_weights(Checkpoint.open(model_dir, cfg).tensors())
    seen = []
    run_batched(backend, step_token_budget=7, after_step=lambda _: seen.append((backend.profile_timeline(), backend.profile_seconds())))
    assert len(seen) > 1
    for timeline, per_kernel in seen:
        names = [name for name, _ in timeline]
        assert names[0].startswith("embed") and names[-1] == "sample"
        starts = [i for i, name in enumerate(names) if name.startswith("attention") and "flash" not in name]
        assert len(starts) == cfg.num_layers
        layers = {tuple(names[a:b]) for a, b in zip(starts, starts[1:])}
        assert len(layers) == 1 and len(next(iter(layers))) > 2  # every layer the same kernels, in the same order
        summed = {}
        for name, seconds in timeline:
            assert seconds >= 0.0
            summed[name] = summed.get(name, 0.0) + seconds
        assert summed == per_kernel
    plain = vulkan_backend(model_dir, "fp16")
    run_batched(plain, step_token_budget=7)
    assert [name for name, _ in plain.profile_timeline()] == ["step"]


def test_a_new_engine_with_the_same_kv_plan_keeps_the_pages_and_the_recorded_steps(checkpoints, cpu_runs):
    """A second engine on one backend with the same KV plan keeps the pages and the recorded steps
    (recording them again takes about 2 s on a real model, with the GPU idle). Every page is filled
    with NaN in between: its results are still the first engine's, bit for bit, so it reads no slot
    it did not write. Another plan gets new pages, and the same results."""
    backend = vulkan_backend(checkpoints["bf16"][0], "fp32")
    pools = {"full_attention": 64, "sliding_attention": 20}
    first = run_batched(backend, 7, block_size=4, num_blocks=pools)
    graphs, pages = list(backend.graphs), {**backend.k_pages}
    for page in [*backend.k_pages.values(), *backend.v_pages.values()]:
        backend.mem.upload(page, np.full(page.size // 4, np.nan, np.float32))
    second = run_batched(backend, 7, block_size=4, num_blocks=pools)
    assert backend.graphs == graphs and backend.k_pages == pages
    assert first[0] == second[0] == cpu_runs["bf16"][0]
    assert all(np.array_equal(a, b) for a, b in zip(first[1], second[1]))
    third = run_batched(backend, 7, block_size=4, num_blocks={**pools, "full_attention": 65})
    assert all(backend.k_pages[layer] is not page for layer, page in pages.items())
    assert third[0] == first[0] and all(np.array_equal(a, b) for a, b in zip(first[1], third[1]))


@pytest.mark.parametrize("chunk", [DEFAULT_CHUNK, 3])
def test_released_and_unused_kv_pages_are_never_read(checkpoints, cpu_runs, chunk):
    """After each step, fill every KV block no sequence in the step holds with NaN (fp32 pages):
    logits still match, so attention reads only the blocks in the tables (with one chunk per
    context, and with many)."""
    model_dir = checkpoints["bf16"][0]
    backend = vulkan_backend(model_dir, "fp32", chunk)
    cfg = backend.cfg
    slot_bytes = cfg.num_kv_heads * cfg.head_dim * 4
    pools = {"full_attention": 64, "sliding_attention": 20}
    nan_block = np.full(4 * slot_bytes // 4, np.nan, np.float32)

    def poison(batch):
        for group in cfg.kv_groups():
            held = set(np.unique(batch.block_tables[group.name]).tolist())
            for block in set(range(pools[group.name])) - held:
                for layer in group.layers:
                    for pages in (backend.k_pages, backend.v_pages):
                        backend.mem.upload(pages[layer], nan_block, block * 4 * slot_bytes)

    completions, logits = run_batched(backend, 7, after_step=poison, block_size=4, num_blocks=pools)
    assert completions == cpu_runs["bf16"][0]
    for ours, ref in zip(logits, cpu_runs["bf16"][1]):
        assert np.abs(ours - ref).max() < TOL["fp32"]


def test_negative_control_a_wrong_model_fails_the_comparison(checkpoints, cpu_runs):
    _, logits = run_batched(vulkan_backend(checkpoints["bf16"][0], "fp16", sliding_window=9), step_token_budget=7)
    assert np.abs(logits[-1] - cpu_runs["bf16"][1][-1]).max() > 10 * TOL["fp16"]


def test_unsupported_shapes_are_refused_before_any_allocation(checkpoints):
    cfg = Gemma3Config.from_dir(checkpoints["bf16"][0])
    with pytest.raises(ValueError, match="hidden_size 60 is not a multiple of 8.*--backend cpu"):
        VulkanBackend(dataclasses.replace(cfg, hidden_size=60))


def test_generate_greedy_runs_a_long_prompt_in_one_chunk(checkpoints, cpu_runs):
    """A whole batch of prefill in one step (the step buffers grow past their first capacity)."""
    backend = vulkan_backend(checkpoints["bf16"][0])
    long_prompts = [PROMPTS[-1] * 4, PROMPTS[0]]
    ours = generate_greedy(backend, long_prompts, 8, step_token_budget=512)
    assert ours == generate_greedy(cpu_backend(checkpoints["bf16"][0]), long_prompts, 8, step_token_budget=512)


# Contexts of several attention chunks. The prompts above reach 61 positions, one chunk of the
# default 64: chunks of 1 and 3 positions split them into many (1: 61 positions double the span
# to 2, the MAX_CHUNKS rule), and prompts of 300 and 140 tokens take 5 and 3 default chunks on
# the global layers (the tiny window, 8, keeps sliding layers at one or two).
LONG_PROMPTS = [
    [2] + [(i * 53) % 290 + 5 for i in range(299)],
    [2, 250, 4, 9, 9, 9, 120, 77],
    [2] + [(i * 11) % 290 + 5 for i in range(139)],
]
LONG_NEW_TOKENS = 12


def greedy_with_logits(backend, prompts, step_token_budget: int) -> tuple[list[list[int]], list[dict[int, np.ndarray]]]:
    """Greedy completions, and per prompt the logits of every token fed, by position."""
    fed = [dict() for _ in prompts]

    def record(prompt_indices, batch, result):
        for s, i in enumerate(prompt_indices):
            for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
                fed[i][int(batch.positions[t])] = result.logits[t]

    completions = generate_greedy(backend, prompts, LONG_NEW_TOKENS, step_token_budget=step_token_budget, on_step=record)
    return completions, fed


def test_the_test_contexts_span_several_attention_chunks():
    global_chunks = chunk_counts(np.array([len(p) + LONG_NEW_TOKENS - 2 for p in LONG_PROMPTS]), None, DEFAULT_CHUNK)
    assert global_chunks.tolist() == [5, 1, 3]
    assert chunk_counts(np.array([60]), None, 1).tolist() == [31]  # span 2
    assert chunk_counts(np.array([60]), 8, 3).tolist() == [4]  # keys 53..60: [51, 54) .. [60, 63)


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16"])
def test_logits_match_the_cpu_backend_with_many_attention_chunks(checkpoints, cpu_runs, kv_dtype, chunk):
    """The mixed, chunked batch of the first test with every context split into many chunks: each
    chunk's partial and the merge in chunk order agree with the CPU's one softmax."""
    completions, logits = run_batched(vulkan_backend(checkpoints["bf16"][0], kv_dtype, chunk), step_token_budget=7)
    ref_completions, ref_logits = cpu_runs["bf16"]
    assert completions == ref_completions
    for ours, ref in zip(logits, ref_logits):
        assert np.abs(ours - ref).max() < TOL[kv_dtype]


@pytest.fixture(scope="module")
def cpu_long_runs(checkpoints):
    return greedy_with_logits(cpu_backend(checkpoints["bf16"][0]), LONG_PROMPTS, step_token_budget=128)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16"])
def test_prompts_longer_than_several_attention_chunks_match_the_cpu_backend(checkpoints, cpu_long_runs, kv_dtype):
    """300- and 140-token prompts beside a short one at the default chunk, prefill in 128-token
    steps, then decode: the same greedy tokens, logits within the tolerance."""
    completions, logits = greedy_with_logits(vulkan_backend(checkpoints["bf16"][0], kv_dtype), LONG_PROMPTS, 128)
    ref_completions, ref_logits = cpu_long_runs
    assert completions == ref_completions
    for ours, ref in zip(logits, ref_logits):
        assert ours.keys() == ref.keys()
        assert max(np.abs(ours[p] - ref[p]).max() for p in ref) < TOL[kv_dtype]


@pytest.mark.parametrize("chunk", [DEFAULT_CHUNK, 3])
def test_long_contexts_are_batch_invariant(checkpoints, chunk):
    """Each long prompt alone (prefill in one step) and all together (prefill in 37-token steps
    beside the others' decode): bit-identical logits at every position, so chunk boundaries and
    merge order do not depend on the batch, the grid or the prefill chunking."""
    backend = vulkan_backend(checkpoints["bf16"][0], "fp16", chunk)
    alone = [greedy_with_logits(backend, [prompt], 512)[1][0] for prompt in LONG_PROMPTS]
    _, together = greedy_with_logits(backend, LONG_PROMPTS, 37)
    for ours, ref in zip(together, alone):
        assert ours.keys() == ref.keys()
        assert all(ours[p].tobytes() == ref[p].tobytes() for p in ref)
