"""The numpy CPU backend against Hugging Face transformers' Gemma 3, in float32.

Tolerance: 1e-4 max abs on logits. Both sides compute in float32 with different summation orders
(BLAS blocking, einsum vs sdpa); the spec measured 2.3e-6 for this kind of model, and every real
modelling mistake (window off by one, wrong RoPE, (1+w), scale) moves logits by 1e-3 to 3, so
1e-4 separates the two cleanly. The negative controls below show that it does.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.engine.generate import generate_greedy
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from tests.tiny_models import make_causal_lm, make_conditional_generation

LOGIT_TOL = 1e-4
NEW_TOKENS = 32
# Lengths around and well past the sliding window (8): 3, 8, 9 and 29 tokens.
PROMPTS = [
    [2, 17, 33],
    [2, 250, 4, 9, 9, 9, 120, 77],
    [2, 5, 6, 7, 8, 9, 10, 11, 12],
    [2] + [(i * 37) % 290 + 5 for i in range(28)],
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    causal = make_causal_lm(root / "causal")
    multimodal = make_conditional_generation(root / "multimodal", causal, max_shard_size="40KB")
    # The hub stores bfloat16: the reference is the float32 model holding the bf16-rounded weights
    # (rounding the parameters only: `.to(bfloat16)` would also round the RoPE inv_freq buffers).
    copy.deepcopy(causal).to(torch.bfloat16).save_pretrained(root / "bf16")
    rounded = copy.deepcopy(causal)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return {
        "causal": (root / "causal", causal),
        "multimodal": (root / "multimodal", multimodal),
        "bf16": (root / "bf16", rounded),
    }


def cpu_backend(model_dir, kv_dtype: str = "fp32", **config_changes) -> CpuBackend:
    cfg = Gemma3Config.from_dir(model_dir)
    backend = CpuBackend(dataclasses.replace(cfg, **config_changes), kv_dtype=kv_dtype)
    backend.load_weights(Checkpoint.open(model_dir, cfg).tensors())
    return backend


def run_batched(backend: CpuBackend, step_token_budget: int, after_step=None, **kwargs):
    """Greedy-generate all prompts together; collect the logits of every token fed, per prompt."""
    fed = [dict() for _ in PROMPTS]  # per prompt: position -> logits row

    def record(prompt_indices, batch, result):
        for s, prompt_index in enumerate(prompt_indices):
            for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
                fed[prompt_index][int(batch.positions[t])] = result.logits[t]
        if after_step is not None:
            after_step(batch)

    completions = generate_greedy(
        backend, PROMPTS, NEW_TOKENS, step_token_budget=step_token_budget, on_step=record, **kwargs
    )
    return completions, [np.stack([f[p] for p in range(len(f))]) for f in fed]


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("layout", ["causal", "multimodal", "bf16"])
def test_logits_match_transformers_for_a_chunked_mixed_batch(checkpoints, layout):
    model_dir, hf = checkpoints[layout]
    completions, logits = run_batched(cpu_backend(model_dir), step_token_budget=7)
    for prompt, completion, ours in zip(PROMPTS, completions, logits):
        full = prompt + completion
        assert len(completion) == NEW_TOKENS and len(ours) == len(full) - 1  # every token fed once
        assert np.abs(ours - hf_logits(hf, full[:-1])).max() < LOGIT_TOL


@pytest.mark.parametrize("layout", ["causal", "multimodal"])
def test_greedy_continuations_equal_transformers_generate(checkpoints, layout):
    model_dir, hf = checkpoints[layout]
    cfg = Gemma3Config.from_dir(model_dir)
    stop = frozenset(cfg.eos_token_ids)
    ours = generate_greedy(cpu_backend(model_dir), PROMPTS, NEW_TOKENS, stop_token_ids=stop, step_token_budget=5)
    for prompt, completion in zip(PROMPTS, ours):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=list(stop)
            )
        assert completion == out[0, len(prompt) :].tolist()


def test_released_and_unused_kv_blocks_are_never_read(checkpoints):
    """After each step, poison with NaN every KV block that no sequence in the step holds, and
    recycle blocks through small pools: logits still match transformers, so the backend reads
    only blocks in the tables (sliding-window blocks released as the window passed included)."""
    model_dir, hf = checkpoints["causal"]
    backend = cpu_backend(model_dir)

    def poison(batch):
        bs = backend.block_size
        for group in backend.cfg.kv_groups():
            held = np.unique(batch.block_tables[group.name])
            for layer in group.layers:
                for cache in (backend.k_cache[layer], backend.v_cache[layer]):
                    blocks = cache.data.reshape(-1, bs, *cache.data.shape[1:])
                    blocks[np.setdiff1d(np.arange(len(blocks)), held[held >= 0])] = np.nan

    # 4 sequences of up to 60 tokens in 4-token blocks would need 60 sliding blocks without release.
    completions, logits = run_batched(
        backend, 7, after_step=poison, block_size=4, num_blocks={"full_attention": 64, "sliding_attention": 20}
    )
    for prompt, completion, ours in zip(PROMPTS, completions, logits):
        assert np.abs(ours - hf_logits(hf, (prompt + completion)[:-1])).max() < LOGIT_TOL


@pytest.mark.parametrize(
    "change",
    [
        dict(sliding_window=9),  # window inclusive of distance W: off by one
        dict(query_pre_attn_scalar=24.0),  # scale 1/sqrt(head_dim) instead of 1/sqrt(query_pre_attn_scalar)
    ],
)
def test_negative_control_a_wrong_model_fails_the_comparison(checkpoints, change):
    model_dir, hf = checkpoints["causal"]
    completions, logits = run_batched(cpu_backend(model_dir, **change), step_token_budget=7)
    full = PROMPTS[-1] + completions[-1]
    assert np.abs(logits[-1] - hf_logits(hf, full[:-1])).max() > 100 * LOGIT_TOL
