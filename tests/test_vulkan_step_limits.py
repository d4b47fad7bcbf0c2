"""No step fails on a device limit: the engine keeps its step budget within what the Vulkan
backend's step buffers can hold (`Backend.max_step_tokens`), the largest storage buffer a device
allows (4 GiB on an H100, 128 MiB on llvmpipe).

The tiny test models need a few MiB, so the device here is made to say its largest storage buffer
is what a step of 64 tokens needs: the backend's allocations are checked against the same figure,
so a step past it would fail exactly as a large model's does on a real device.
"""

from __future__ import annotations

import dataclasses

import pytest

from gemma_batch.backends.kv_formats import kv_slot_bytes
from gemma_batch.backends.vulkan.errors import DeviceMemoryError
from gemma_batch.backends.vulkan.step_buffers import Capacity, first_capacity, scratch_sizes
from gemma_batch.engine.generate import generate_greedy
from tests.test_cpu_vs_transformers import PROMPTS, checkpoints, cpu_backend  # noqa: F401
from tests.test_vulkan_backend import vulkan_backend


LONG_PROMPTS = [PROMPTS[0], PROMPTS[1] * 3, (PROMPTS[2] * 40)[:200]]  # 250 tokens together
NEW = 8


def table_widths(backend) -> dict[str, int]:
    """Block-table entries per sequence for LONG_PROMPTS (16-token blocks, as `generate_greedy`)."""
    longest = max(len(p) for p in LONG_PROMPTS) + NEW
    return {g.name: -(-longest // 16) for g in backend.cfg.kv_groups()}


def largest_scratch(backend, tokens: int) -> int:
    """The largest step buffer a step of `tokens` of LONG_PROMPTS needs."""
    widths = tuple(sorted(table_widths(backend).items()))
    capacity = first_capacity(widths).grown_to(Capacity(tokens, len(LONG_PROMPTS), len(LONG_PROMPTS), widths))
    coop = backend.coop_min_chunk if backend.device.coopmat else None
    sizes = scratch_sizes(backend.cfg, capacity, 16, backend.attention_chunk, coop, backend.device.info.sm_count)
    return max(size for size, _ in sizes.values())


def shrink_largest_buffer(backend, tokens: int) -> None:
    """Make the backend's device allow storage buffers as large as a step of `tokens` of
    LONG_PROMPTS needs, or as a layer's KV pages of `generate_greedy`'s plan if larger, and no
    larger; a step of twice the tokens must not fit (else the test would prove nothing)."""
    blocks = max(table_widths(backend).values()) * len(LONG_PROMPTS)  # generate_greedy's pools
    page = blocks * 16 * kv_slot_bytes(backend.kv_dtype, backend.cfg.num_kv_heads, backend.cfg.head_dim)
    limit = max(largest_scratch(backend, tokens), page)
    assert largest_scratch(backend, 2 * tokens) > limit
    backend.device.info = dataclasses.replace(backend.device.info, max_storage_buffer_range=limit)


def run(backend, budget: int, steps: list[int] | None = None) -> list[list[int]]:
    hook = None if steps is None else (lambda ids, batch, result: steps.append(batch.num_tokens))
    return generate_greedy(backend, LONG_PROMPTS, NEW, step_token_budget=budget, on_step=hook)


def test_a_budget_past_the_largest_buffer_is_lowered_to_fit(checkpoints):
    """Three prompts of 250 tokens together with a budget of 4,096 tokens, on a device whose
    buffers hold a 64-token step: the engine plans 64-token steps, the prefill is chunked, and the
    greedy tokens are the CPU backend's."""
    backend = vulkan_backend(checkpoints["bf16"][0], "fp32")
    shrink_largest_buffer(backend, 64)
    steps = []
    completions = run(backend, 4096, steps)
    assert max(steps) == 64 and backend.buffers.capacity.tokens == 64  # a 250-token step was asked for
    assert completions == run(cpu_backend(checkpoints["bf16"][0]), 4096)


def test_the_limit_is_the_devices(checkpoints):
    """`max_step_tokens` is the largest step the buffers hold: reserving for it fits, and without
    the engine's cap the first longer step stops with the buffer named (the failure the cap
    prevents)."""
    backend = vulkan_backend(checkpoints["bf16"][0], "fp32")
    shrink_largest_buffer(backend, 128)
    widths = table_widths(backend)
    backend.allocate_kv({g: 4 * w for g, w in widths.items()}, 16)
    assert backend.max_step_tokens(len(LONG_PROMPTS), widths) == 128
    backend.reserve(128, len(LONG_PROMPTS), widths)
    backend.max_step_tokens = lambda *args: None
    with pytest.raises(DeviceMemoryError, match="exceeds .* largest storage buffer"):
        run(backend, 4096)
