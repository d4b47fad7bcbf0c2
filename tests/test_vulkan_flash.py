"""Prefill attention on the matrix units (attention_flash.comp) against a float64 reference, and
its batch invariance: a token's output bits do not depend on how its prompt is cut into tiles.

The kernel runs only on a device with fp16 cooperative matrices (the GPU machine); llvmpipe in CI
has none. Which tokens it takes and in which tiles (flash.py) is tested everywhere.

Tolerance of the kernel against the reference: the kernel rounds the scaled queries to fp16 (the
reference does the same, so the scores differ only by fp32 sums, ~1e-6 relative) and the
probabilities P to fp16 before P.V (relative 2^-11 each), while the running sum l adds the fp32
P. An output element o = sum_k P_k v_k / l then moves by at most 2^-11 sum_k P_k |v_k| / l <=
2^-11 max |v|; the bound is 2^-10 max |v| (twice that). Pages are fp16 (exact as the kernel stages
them), bf16 (exact in fp16 for these magnitudes) or int8 (code times scale rounded to fp16 in the
kernel: the reference rounds it the same way).
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.base import StepBatch
from gemma_batch.backends.kv_formats import kv_int8_group
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.flash import ENV as FLASH_ENV, FLASH_ROWS, tiles
from gemma_batch.model.checkpoint import DEMO_MODEL, Checkpoint
from gemma_batch.model.config import Gemma3Config
from tests.test_cpu_vs_transformers import cpu_backend, run_batched
from tests.test_vulkan_attention import page_bytes
from tests.test_vulkan_coopmat import needs_coopmat
from tests.vulkan_dispatch import Dispatches

BLOCK = 16
FP16_TOL = 1e-2  # logits, fp16 KV pages: test_vulkan_backend.py's (the flash kernel's roundings measured below it)
# (sequence, first position of the step, tokens in the step): the second sequence's earlier keys
# are in the pages already (a later prefill chunk)
RUNS = [(0, 0, 100), (1, 37, 84), (2, 5, 3)]


def pages(kv: str, rows: int, hd: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Random K or V pages (test_vulkan_attention.page_bytes), and their values as the kernel
    stages them (fp16, widened to float64)."""
    raw = page_bytes(kv, rows, hd, rng)
    if kv == "float16":
        values = raw.view(np.float16).astype(np.float32)
    elif kv == "bfloat16":
        values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:  # int8: codes, then a scale per group of values; the kernel rounds code * scale to fp16
        group = kv_int8_group(hd)
        words = raw.view(np.uint32).reshape(rows, hd // 4 + hd // group)
        scales = words[:, hd // 4:].copy().view(np.float32)  # [rows, groups]
        values = words[:, :hd // 4].copy().view(np.int8).astype(np.float32) * np.repeat(scales, group, axis=1)
    return raw, values.reshape(rows, hd).astype(np.float16).astype(np.float64)


def setup(kv: str, nh: int, nkv: int, hd: int, seed: int):
    rng = np.random.default_rng(seed)
    width = 10  # blocks per sequence: positions up to 159
    table = rng.permutation(len(RUNS) * width).astype(np.int32).reshape(len(RUNS), width)
    positions = np.concatenate([np.arange(p, p + n) for _, p, n in RUNS]).astype(np.int32)
    seqs = np.concatenate([np.full(n, s) for s, _, n in RUNS])
    T, rows = len(positions), len(RUNS) * width * BLOCK * nkv
    q = (rng.standard_normal((T, nh, hd)) * 2).astype(np.float32)
    (k_raw, k), (v_raw, v) = pages(kv, rows, hd, rng), pages(kv, rows, hd, rng)
    return table, positions, seqs, q, k_raw, k, v_raw, v


def reference(table, positions, seqs, q, k, v, nkv: int, window: int, scale: float) -> np.ndarray:
    T, nh, hd = q.shape
    G = nh // nkv
    qs = (q * np.float32(scale)).astype(np.float16).astype(np.float64)
    out = np.zeros((T, nh, hd))
    for t in range(T):
        p, s = int(positions[t]), int(seqs[t])
        keys = np.arange(0 if window == 0 else max(0, p - window + 1), p + 1)
        slots = table[s, keys // BLOCK] * BLOCK + keys % BLOCK
        for h in range(nh):
            rows = slots * nkv + h // G
            sc = k[rows] @ qs[t, h]
            w = np.exp(sc - sc.max())
            out[t, h] = w @ v[rows] / w.sum()
    return out


def tiles_of(per_tile: list[int]) -> np.ndarray:
    """Tiles cutting each run's tokens into the sizes of `per_tile` (cycled), at most what a tile holds."""
    out, start, i = [], 0, 0
    for s, _, n in RUNS:
        k = 0
        while k < n:
            size = min(per_tile[i % len(per_tile)], n - k)
            out.append((start + k, size, s, 0))
            k, i = k + size, i + 1
        start += n
    return np.asarray(out, np.int32)


def run(kv, nh, nkv, hd, window, tiles, seed) -> tuple[np.ndarray, tuple]:
    table, positions, seqs, q, k_raw, k, v_raw, v = data = setup(kv, nh, nkv, hd, seed)
    T = len(positions)
    with Dispatches(tokens=T, seqs=len(RUNS)) as d:
        bufs = {0: d.upload(q, "q"), 1: d.alloc(q.nbytes, "out"), 2: d.upload(positions, "positions"),
                3: d.upload(tiles, "tiles"), 4: d.upload(table, "table"), 6: d.upload(k_raw, "k"), 8: d.upload(v_raw, "v")}
        d.dispatch(f"attention_flash_{kv}", bufs,
                   {"num_heads": nh, "num_kv_heads": nkv, "head_dim": hd, "window": window, "block_size": BLOCK,
                    "table_stride": table.shape[1], "scale": hd ** -0.5}, len(tiles) * nkv, specialize=True)
        d.run()
        return d.download(bufs[1]).view(np.float32).reshape(q.shape), data


CASES = [
    ("float16", 8, 4, 256, 0),   # the 4b model's heads, a global layer
    ("float16", 8, 4, 256, 40),  # a sliding window shorter than the tiles' spans
    ("bfloat16", 4, 1, 64, 0),   # 4 query heads a kv head (the 1b's, the demo model's)
    ("int8", 32, 16, 128, 24),   # the 27b's heads
]


@needs_coopmat
@pytest.mark.parametrize("kv,nh,nkv,hd,window", CASES)
def test_flash_attention_matches_the_reference(kv, nh, nkv, hd, window):
    per_tile = FLASH_ROWS // (nh // nkv)
    got, (table, positions, seqs, q, _, k, _, v) = run(kv, nh, nkv, hd, window, tiles_of([per_tile]), seed=hd + window)
    ref = reference(table, positions, seqs, q, k, v, nkv, window, hd ** -0.5)
    err = np.abs(got - ref).max()
    assert err <= 2.0 ** -10 * np.abs(v).max(), err
    assert err > 0  # (the kernel ran: its output is no copy of the reference)


@needs_coopmat
@pytest.mark.parametrize("kv,nh,nkv,hd,window", CASES[1:3])
def test_flash_attention_is_bit_identical_in_any_tiling(kv, nh, nkv, hd, window):
    """Whole tiles against tiles of 1 to 7 tokens (tile boundaries everywhere else, rows of a
    token at other rows of the tile): every output bit equal."""
    per_tile = FLASH_ROWS // (nh // nkv)
    whole, _ = run(kv, nh, nkv, hd, window, tiles_of([per_tile]), seed=3)
    ragged, _ = run(kv, nh, nkv, hd, window, tiles_of([1, 5, 7, 2, per_tile]), seed=3)
    assert whole.tobytes() == ragged.tobytes()


@needs_coopmat
@pytest.mark.parametrize("flash", ["on", "off"])
def test_prompts_on_the_flash_kernel_match_the_cpu_backend(monkeypatch, flash):
    """The demo model (4 query heads a kv head, head_dim 64, a 64-token window), fp16 KV pages:
    prompts in 7-token steps beside decode tokens, against the CPU backend with the same pages."""
    monkeypatch.setenv(FLASH_ENV, "1" if flash == "on" else "0")
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    backend = VulkanBackend(cfg, kv_dtype="fp16", profile=True)
    backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    ran = set()
    completions, logits = run_batched(backend, step_token_budget=7, after_step=lambda _: ran.update(backend.profile_seconds()))
    assert ("attention_flash_float16" in ran) == (flash == "on")
    ref_completions, ref_logits = run_batched(cpu_backend(DEMO_MODEL, kv_dtype="fp16"), step_token_budget=7)
    err = max(np.abs(ours - ref).max() for ours, ref in zip(logits, ref_logits))
    print(f"flash {flash}: logits max abs difference {err:.3g}")
    assert completions == ref_completions
    assert err < FP16_TOL


def test_prompt_tokens_and_their_tiles():
    """Three sequences in one step: a whole 70-token prompt, a decode token, and the end of a
    prompt followed by two generated tokens recomputed after a preemption (positions 43 and 44
    are not prompt tokens: they stay on attention.comp, as when they were first decoded)."""
    positions = np.concatenate([np.arange(70), [80], np.arange(40, 45)]).astype(np.int32)
    starts = np.array([0, 70, 71, 76], np.int32)
    batch = StepBatch(token_ids=np.zeros(76, np.int32), positions=positions, seq_starts=starts,
                      context_lens=np.array([70, 81, 45], np.int32), block_tables={}, slots={},
                      sample=np.ones(3, bool), prompt_lens=np.array([70, 50, 43], np.int32))
    prompt = batch.prompt_mask()
    assert prompt.tolist() == [True] * 70 + [False] + [True] * 3 + [False] * 2
    assert tiles(batch, prompt, 32).tolist() == [[0, 32, 0, 0], [32, 32, 0, 0], [64, 6, 0, 0], [71, 3, 2, 0]]
    batch.prompt_lens = None  # (a caller that names no prompts: every token on attention.comp)
    assert not batch.prompt_mask().any()
