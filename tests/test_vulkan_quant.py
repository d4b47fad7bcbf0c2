"""int8 and int4 weights on the Vulkan backend against the CPU backend, given the same quantized
weights (the CPU backend's own numerics against transformers and its quantization against bf16
are tests/test_quant.py's and tests/test_quality.py's).

Tolerances, on logits (max abs; the tiny models' logits reach about 3), fp32 KV pages:
- matmul.comp (llvmpipe, and any device without cooperative matrices): 1e-4, as for bf16 weights
  in tests/test_vulkan_backend.py. Both backends multiply by the same dequantized values in fp32;
  the kernel applies int8's row scale to the whole sum and int4's group scale to each piece of 8
  rather than to every weight, which moves only the rounding of the sums (a few 1e-6).
- matmul_coop.comp: 1e-2. The staged weight fp16(code * scale (+ minimum)) is the CPU's fp32 weight rounded
  once more, by up to 2^-11 relative, the same size as the fp16 KV pages' rounding, whose bound
  tests/test_vulkan_backend.py derives.
A wrong scale, group or nibble order moves logits by far more: the negative control below
checks that the int4 model is farther than that from the unquantized one.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.fragment_order import INT8_TILES_ENV
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat
from gemma_batch.model.quant_cache import load_converted
from tests.test_cpu_vs_transformers import checkpoints, run_batched  # noqa: F401
from tests.test_vulkan_coopmat import _device_has_coopmat


def load(backend, model_dir, cfg, weights: str):
    backend.load_weights(load_converted(Checkpoint.open(model_dir, cfg), WeightFormat.parse(weights, 32), None).tensors)
    return backend


@pytest.fixture(scope="module")
def cpu_runs(checkpoints):
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    return {w: run_batched(load(CpuBackend(cfg), model_dir, cfg, w), step_token_budget=7) for w in ("bf16", "int8", "int4")}


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_logits_and_greedy_tokens_match_the_cpu_backend(checkpoints, cpu_runs, weights):
    """4 prompts together, prefill in 7-token chunks mixed with decode (every matmul kind, the
    LM head's gathered rows and the int8 embedding lookup)."""
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    backend = load(VulkanBackend(cfg, kv_dtype="fp32"), model_dir, cfg, weights)
    tol = 1e-2 if backend.device.coopmat else 1e-4
    completions, logits = run_batched(backend, step_token_budget=7)
    ref_completions, ref_logits = cpu_runs[weights]
    for ours, ref, completion, ref_completion in zip(logits, ref_logits, completions, ref_completions):
        # Greedy texts part only at a near-tie the weights' rounding may turn: the CPU's two best
        # logits there within 2 tol (on the H200 two of the four int8 / int4 texts part at gaps of
        # 3e-4 and 5e-4, with every logit before within 3e-3); up to there the logits agree.
        same = next((i for i, (a, b) in enumerate(zip(completion, ref_completion)) if a != b), len(completion))
        fed = len(ref) - len(ref_completion) + 1 + same  # the positions fed before they part (prompt included)
        assert np.abs(ours[:fed] - ref[:fed]).max() < tol
        if same < len(completion):
            best = np.sort(ref[fed - 1])
            assert backend.device.coopmat and best[-1] - best[-2] < 2 * tol  # (matmul.comp's texts stay equal)


def test_negative_control_quantization_moves_logits_beyond_the_tolerance(cpu_runs):
    """The comparison above could tell int4 from the unquantized weights (and so a kernel that
    dropped or misplaced the scales)."""
    for ours, ref in zip(cpu_runs["int4"][1], cpu_runs["bf16"][1]):
        assert np.abs(ours - ref).max() > 10 * 1e-2


@pytest.mark.skipif(not _device_has_coopmat(), reason="the Vulkan device has no fp16 cooperative matrices")
def test_int8_tiles_give_the_staged_kernels_logits_bit_for_bit(monkeypatch):
    """int8 weights in fragment-order tiles (T8: matmul_coop_direct.comp dequantizing in registers,
    and the prefill tiles staging them) against int8 in rows (matmul_coop.comp staging every step):
    the same fp16(code * scale) multiplied in the same order, so identical logits, in 7-token steps
    and in an 80-token prefill step, on the demo model (every matrix on the path, the tied LM head
    and the embedding lookup)."""
    from gemma_batch.engine.generate import generate_greedy

    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    runs = []
    for on in ("1", "0"):
        monkeypatch.setenv(INT8_TILES_ENV, on)
        backend = load(VulkanBackend(cfg, kv_dtype="fp32"), DEMO_MODEL, cfg, "int8")
        if backend.kernels.fragment_loads:
            assert backend.weights.dtype(0, "gate_proj") == backend.weights.dtype(-1, "lm_head") == ("T8" if on == "1" else "I8")
        _, logits = run_batched(backend, step_token_budget=7)
        prefill = []
        generate_greedy(backend, [list(range(3, 83))], 2, step_token_budget=128,
                        on_step=lambda _, batch, result: prefill.append(result.logits.copy()))
        runs.append(logits + prefill)
        backend.close()
    for ours, ref in zip(*runs):
        assert np.array_equal(ours, ref)
