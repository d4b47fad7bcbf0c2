"""The Vulkan backend's bf16 and int8 KV pages against the CPU backend with the same KV dtype, and
the pages' bytes against `kv_formats` (the layout: shaders/kv_pages.glsl).

Tolerances, on logits (max abs), same KV dtype on both sides: besides fp32 summation orders
(1e-4, as with fp32 pages), a value may round to the neighbouring bf16 or int8 level on one
backend only, where the two backends' K or V straddle a rounding boundary. Emulated on the CPU
with 2e-6 relative noise on K and V before rounding (4 seeds), 27-36 of 1e5 values flipped in
bf16 and 7-15 in int8, moving logits by up to 2.4e-3 (bf16) and 7.4e-3 (int8); measured 1.7e-3
and 3e-6 on llvmpipe, 2.0e-3 and 5.8e-4 on an H100 (cooperative-matrix path). Bounds 5e-3 and 2e-2 are well under what the rounding itself does to the logits
(bf16 vs fp32 pages on the CPU: 2e-2; int8: 3.8, on these sensitive random models), so a wrong
rounding or scale fails. The page test is exact.

That noise model is the fp32 arithmetic of split inputs on the matrix units, so this module runs
them (GEMMA_BATCH_VK_COOPMAT_INPUTS=split; the page test also needs both backends on the same
inputs). The default fp16 inputs round K and V's inputs to 2^-12, about a hundred times that
noise, and flip correspondingly more values: on the H100, 1.1e-2 (bf16) and 2.5e-2 (int8) at
`d08d9ab`. The default path is held to the CPU backend by test_vulkan_backend.py (fp16 pages) and
by the demo model's quality tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.kv_formats import KV_DTYPES, KVStore, kv_slot_bytes
from gemma_batch.backends.vulkan.attention import DEFAULT_CHUNK
from gemma_batch.backends.vulkan.backend import KV_VARIANTS
from gemma_batch.backends.vulkan.coopmat import INPUTS_ENV
from gemma_batch.engine.generate import generate_greedy
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.config import Gemma3Config
from tests.test_cpu_vs_transformers import checkpoints, cpu_backend, run_batched  # noqa: F401
from tests.test_vulkan_backend import LONG_PROMPTS, vulkan_backend

TOL = {"bf16": 5e-3, "int8": 2e-2}


@pytest.fixture(scope="module", autouse=True)
def split_inputs():
    """Split inputs on the matrix units for every backend this module makes (module doc)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(INPUTS_ENV, "split")
        yield


@pytest.fixture(scope="module")
def cpu_runs(checkpoints):
    """CPU completions and logits per KV dtype (bf16 weights), prefill chunked to 7 tokens."""
    return {kv: run_batched(cpu_backend(checkpoints["bf16"][0], kv), step_token_budget=7) for kv in TOL}


def test_the_vulkan_backend_runs_every_kv_dtype():
    assert set(KV_VARIANTS) == set(KV_DTYPES)


@pytest.mark.parametrize("chunk", [DEFAULT_CHUNK, 3])
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_logits_and_greedy_tokens_match_the_cpu_backend_with_the_same_kv_dtype(checkpoints, cpu_runs, kv_dtype, chunk):
    """4 prompts, prefill in 7-token chunks mixed with decode; one chunk per context, and many
    (chunk 3: each chunk's partial, then the merge)."""
    completions, logits = run_batched(vulkan_backend(checkpoints["bf16"][0], kv_dtype, chunk), step_token_budget=7)
    ref_completions, ref_logits = cpu_runs[kv_dtype]
    assert completions == ref_completions
    for ours, ref in zip(logits, ref_logits):
        assert np.abs(ours - ref).max() < TOL[kv_dtype]


def downloaded_pages(backend, layer: int) -> tuple[KVStore, KVStore]:
    """Layer `layer`'s K and V pages as KVStores, parsed as shaders/kv_pages.glsl lays them out."""
    cfg, kv = backend.cfg, backend.kv_dtype
    nkv, hd = cfg.num_kv_heads, cfg.head_dim
    stores = []
    for pages in (backend.k_pages, backend.v_pages):
        raw = backend.mem.download(pages[layer])
        slots = raw.size // kv_slot_bytes(kv, nkv, hd)
        store = KVStore(kv, slots, nkv, hd)
        if kv == "int8":  # rows of hd int8 codes, then the fp32 scale of each group of the row's values
            rows = raw.reshape(slots, nkv, kv_slot_bytes(kv, 1, hd))
            store.data[:] = rows[..., :hd].view(np.int8)
            store.scales[:] = rows[..., hd:].copy().view(np.float32)
        else:
            store.data[:] = raw.view(store.data.dtype).reshape(store.data.shape)
        stores.append(store)
    return stores[0], stores[1]


@pytest.mark.parametrize("kv_dtype, model", [("bf16", "tiny"), ("int8", "tiny"), ("int8", "demo")])
def test_the_pages_hold_k_and_v_rounded_as_kv_formats_defines(checkpoints, kv_dtype, model):
    """One prefill step of the long prompts. Layer 0's K and V depend on the embeddings and the
    QKV projection alone, so they are the same whatever the KV dtype: its bf16 / int8 pages hold,
    bit for bit (values and scales), what KVStore.write makes of the K and V that its fp32 pages
    hold; and those are the CPU backend's up to summation order and RoPE's sin/cos (2.5e-5 at
    position 300 on llvmpipe, whose unfused fma coarsens common.glsl's range reduction). The tiny
    model's heads of 24 take one int8 scale each, the demo model's of 64 one per 32 values (its
    148 tokens of the two shorter prompts: llvmpipe is slow)."""
    model_dir = checkpoints["bf16"][0] if model == "tiny" else DEMO_MODEL
    prompts = LONG_PROMPTS if model == "tiny" else LONG_PROMPTS[1:]
    group = next(g for g in Gemma3Config.from_dir(model_dir).kv_groups() if 0 in g.layers)
    written = []  # per step, the slots of the group's K and V

    def record(_, batch, __):
        written.append(batch.slots[group.name])

    pages = {}
    for kv in ("fp32", kv_dtype):
        backend = vulkan_backend(model_dir, kv)
        generate_greedy(backend, prompts, 1, on_step=record)
        pages[kv] = downloaded_pages(backend, 0)
    backend = cpu_backend(model_dir, "fp32")
    generate_greedy(backend, prompts, 1, on_step=record)
    slots = written[0]  # one step per run, the same slots in each
    assert len(written) == 3 and len(slots) == sum(map(len, prompts)) and all(np.array_equal(s, slots) for s in written)

    cpu = (backend.k_cache[0], backend.v_cache[0])
    for exact, ours, ref in zip(pages["fp32"], pages[kv_dtype], cpu):
        x = exact.data[slots]  # [T, nkv, hd] float32
        np.testing.assert_allclose(x, ref.data[slots], rtol=1e-5, atol=5e-5)
        expected = KVStore(kv_dtype, len(slots), *x.shape[1:])
        expected.write(np.arange(len(slots)), x)
        assert np.array_equal(ours.data[slots], expected.data)
        if kv_dtype == "int8":
            assert np.array_equal(ours.scales[slots], expected.scales)
