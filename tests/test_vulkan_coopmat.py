"""The cooperative-matrix matmuls (split.comp, matmul_coop.comp, reduce.comp) against the CPU reference.

They run only on a device with fp16 cooperative matrices and subgroups of 32 (the GPU machine's
H100); Mesa's llvmpipe in CI has none, so there these tests skip and test_vulkan_backend.py
covers the portable kernels. On such a device every other Vulkan test runs them too, since they
are the default there; these tests also check that they ran and force several K chunks.

Tolerance, logits max abs with fp32 KV pages: 1e-4, as for the portable kernels. The input of
each matmul is split into fp16 hi + lo after scaling its row by a power of two (22 significant
bits: relative error <= 2^-22 = 2.4e-7 per element, over the row's largest value); weights are
bf16, exact in fp16; the matrix units accumulate in fp32. A dot product moves by a few 1e-7
relative, far below the bound. A matmul on plain fp16 inputs (2^-11 = 4.9e-4 relative) moves
it by orders of magnitude more: the negative control shows that in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.coopmat import DISABLE_ENV, INPUTS_ENV, split_inputs
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.fragment_order import ENV as FRAGMENT_ENV
from gemma_batch.backends.vulkan.tuning import TUNE_ENV
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat
from gemma_batch.model.quant_cache import load_converted
from tests.step_logits import assert_same_logits, keep_logits
from tests.test_cpu_vs_transformers import checkpoints, cpu_backend, run_batched  # noqa: F401


def _device_has_coopmat() -> bool:
    try:
        device = Device()
    except Exception:  # noqa: BLE001 - no Vulkan at all: test_vulkan_backend reports that
        return False
    try:
        return device.coopmat
    finally:
        device.close()


needs_coopmat = pytest.mark.skipif(not _device_has_coopmat(), reason="the Vulkan device has no fp16 cooperative matrices")


def backend_for(model_dir, weights: str = "bf16", **kwargs) -> VulkanBackend:
    cfg = Gemma3Config.from_dir(model_dir)
    backend = VulkanBackend(cfg, kv_dtype="fp32", profile=True, **kwargs)
    checkpoint = Checkpoint.open(model_dir, cfg)
    quantized = weights != "bf16"
    backend.load_weights(load_converted(checkpoint, WeightFormat.parse(weights), None).tensors if quantized
                         else checkpoint.tensors())
    return backend


@needs_coopmat
@pytest.mark.parametrize("min_chunk", [256, 64])  # one K chunk per matrix; up to 2 (sums added by reduce.comp)
@pytest.mark.parametrize("model", ["demo", "tiny bf16"])
def test_cooperative_matmuls_match_the_cpu_backend(checkpoints, model, min_chunk):
    model_dir = DEMO_MODEL if model == "demo" else checkpoints["bf16"][0]
    backend = backend_for(model_dir, coop_min_chunk=min_chunk)
    ran = set()
    completions, logits = run_batched(backend, step_token_budget=7, after_step=lambda _: ran.update(backend.profile_seconds()))
    assert {"split_norm", "coop_t16", "reduce_qk_rope_float32"} <= ran  # the fast path ran (qkv fits both)
    if model == "demo":  # every matmul fits; the tiny model's others (64, 96, 300 wide) stay on matmul.comp
        # the LM head: of one K chunk it writes its logits itself (Y_OUT), of several the reduce sums them
        lm_head = {"coop_rows_y_out_t16"} if min_chunk == 256 else {"coop_rows_t16", "reduce_rows"}
        assert {"coop_gated_t16", "reduce_gated_split", "reduce_post_norm_split", "reduce_post_norm", *lm_head} <= ran
        assert "attention_float32_split_qk" in ran  # decode steps made their heads in attention (o on the path too)
    ref_completions, ref_logits = run_batched(cpu_backend(model_dir), step_token_budget=7)
    assert completions == ref_completions
    for ours, ref in zip(logits, ref_logits):
        assert np.abs(ours - ref).max() < 1e-4


@needs_coopmat
@pytest.mark.parametrize("summed", ["in the tile", "by the reduce", "by the reduce, no chunk tile"])
@pytest.mark.parametrize("inputs", ["split", "fp16"])
def test_prefill_above_the_fold_matches_decode_sized_steps(monkeypatch, inputs, summed):
    """Steps of more than 128 tokens run the prefill tile (the demo model's fp16 tiles: the direct
    decode tile takes up to COOP_DIRECT_FOLD_ROWS), smaller ones the decode tile. The prefill
    tile's workgroups sum the K chunks themselves where the step fills the device (forced here for
    the demo model's small matrices: no step is too small), else each chunk is a workgroup and
    reduce.comp adds them, as in decode steps (coop_tiles.coop_fold_rows). A prompt run in one
    160-token step and in 7-token steps gives identical logits either way, with either inputs (the
    demo model's matrices of 128-multiple widths on the 128-wide tile of that input mode). Prompt
    tokens take these tiles only without the prompt tile (GEMMA_BATCH_VK_PROMPT_TILE=0); with it,
    decode tokens and recomputed completions still do (test_batch_invariance.py's preemptions).
    Chunks that are workgroups run the chunk tile (CHUNK_K), or without it (its switch off) the
    prefill tile itself."""
    from gemma_batch.backends.vulkan import coop_tiles
    from gemma_batch.engine.generate import generate_greedy

    monkeypatch.setenv(INPUTS_ENV, inputs)
    monkeypatch.setenv(coop_tiles.PROMPT_TILE_ENV, "0")
    monkeypatch.setenv(coop_tiles.CHUNK_TILE_ENV, "0" if summed.endswith("no chunk tile") else "1")
    if summed == "in the tile":
        monkeypatch.setattr(coop_tiles, "COOP_FOLD_GROUPS_PER_SM", 0)
    prompt = list(range(3, 163))
    runs, ran, fold_rows = [], set(), set()
    for budget in (256, 7):
        backend = backend_for(DEMO_MODEL, coop_min_chunk=64)
        rows = {}

        def record(_, batch, result, rows=rows, backend=backend):
            for t in range(batch.num_tokens):
                rows[int(batch.positions[t])] = result.logits[t].copy()
            if batch.num_tokens > coop_tiles.COOP_DIRECT_FOLD_ROWS:
                ran.update(backend.profile_seconds())

        generate_greedy(backend, [prompt], 4, step_token_budget=budget, on_step=record)
        fold_rows |= {int(words[2]) for kind, _ in backend.graphs[0].grid_slots._specs  # the layers' (not the LM head's)
                      if (words := kind.split())[0] == "coopfold_tokens" and int(words[1]) > 1}
        runs.append(rows)
        backend.close()
    assert fold_rows and (max(fold_rows) == coop_tiles.COOP_DIRECT_FOLD_ROWS if summed == "in the tile"
                          else min(fold_rows) >= len(prompt))
    tile, other = ("_wide", "_wide_split") if inputs == "fp16" else ("_wide_split", "_wide")
    chunk_tile = {f"coop_t16_fold{tile}_chunk", f"coop_gated_t16_fold{tile}_chunk"}
    assert {f"coop_t16_fold{tile}", f"coop_gated_t16_fold{tile}"} <= ran
    assert (chunk_tile <= ran) == (summed != "by the reduce, no chunk tile")
    assert not {f"coop{gated}_t16_fold{t}" for gated in ("", "_gated") for t in ("", other)} & ran
    assert runs[0].keys() == runs[1].keys()
    for pos in runs[0]:
        assert np.array_equal(runs[0][pos], runs[1][pos]), pos


@needs_coopmat
@pytest.mark.parametrize("inputs, weights", [("split", "bf16"), ("fp16", "bf16"), ("fp16", "int4"), ("fp16", "int8")])
def test_the_prompt_tile_gives_the_same_bits_in_any_step_and_form(monkeypatch, inputs, weights):
    """Prompt tokens' products are one sum over K on the prompt tile (coop_tiles): a prompt run in
    one 80-token step, in 7-token steps (each beside a decode token once the first prompt is in),
    and with the tile's 128-row or (fp16 inputs, or the 64-output tile of int8 / int4 weights)
    32-row form forced gives identical logits."""
    from gemma_batch.backends.vulkan import grids
    from gemma_batch.engine.generate import generate_greedy

    monkeypatch.setenv(INPUTS_ENV, inputs)
    monkeypatch.setenv(TUNE_ENV, "0")  # (the tuner's timings of the forms would show in the profile)
    prompts = [list(range(3, 83)), list(range(5, 40))]
    weights_small = not (inputs == "split" and weights == "bf16")
    runs = []
    for budget, small in ((128, None), (7, None), (128, True), (128, False)):
        rows: dict = {}
        ran: set = set()

        def record(ids, batch, result, rows=rows, ran=ran):
            keep_logits(rows, ids, batch, result)
            ran.update(backend.profile_seconds())

        with monkeypatch.context() as patch:
            if small is not None:
                patch.setattr(grids, "coop_whole_small", lambda rows, tiles, sms, small=small: small)
            backend = backend_for(DEMO_MODEL, weights)
            generate_greedy(backend, prompts, 4, step_token_budget=budget, on_step=record)
            backend.close()
        # The recording holds the 32-row form beside the 128-row one where the tile has it (split inputs'
        # 128-wide tile has none); the grids give one of the two the step's workgroups, as forced.
        assert any(name.endswith("_whole_small") for name in ran) == weights_small, sorted(ran)
        runs.append(rows)
    for other in runs[1:]:
        assert_same_logits(other, runs[0])


def greedy_both_ways(monkeypatch, weights: str, prompts: list[list[int]], configure, **kwargs) -> list[tuple[dict, set]]:
    """For each of True and False, `configure(patch, it)`, then the demo model's greedy run of
    `prompts` (4 new tokens, steps of up to 4,096 tokens): every token's logits, and the kernels
    that a decode step of every sequence ran."""
    from gemma_batch.engine.generate import generate_greedy

    runs = []
    for flag in (True, False):
        rows: dict = {}
        ran: set = set()

        def record(ids, batch, result, rows=rows, ran=ran):
            keep_logits(rows, ids, batch, result)
            if batch.num_tokens == len(ids) == len(prompts):  # a decode step of every sequence
                ran.update(backend.profile_seconds())

        with monkeypatch.context() as patch:
            configure(patch, flag)
            backend = backend_for(DEMO_MODEL, weights, **kwargs)
            generate_greedy(backend, prompts, 4, step_token_budget=4096, on_step=record)
            backend.close()
        runs.append((rows, ran))
    return runs


@needs_coopmat
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_decode_steps_of_any_size_make_their_heads_in_attention_with_the_same_bits(monkeypatch, weights):
    """Decode steps up to the decode tiles' rows replay a recording whose attention makes its heads
    from qkv's K-chunk sums (attention_<kv>_split_qk; recordings.py), here steps of 100 tokens on
    the 128-row direct decode tiles (fp16 and int8 tiles). The same steps on the "chunked"
    recording (qkv's reduce, then attention) give identical logits."""
    from gemma_batch.backends.vulkan import graph, recordings

    def configure(patch, heads_in_attention):
        if not heads_in_attention:
            patch.setattr(graph, "recording_for", lambda *args: {"decode": "chunked", "decode_rows": "chunked"}.get(
                mode := recordings.recording_for(*args), mode))

    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 4000, int(rng.integers(2, 40))).tolist() for _ in range(100)]
    (ours, ran), (ref, ran_ref) = greedy_both_ways(monkeypatch, weights, prompts, configure, coop_min_chunk=64)
    assert "attention_float32_split_qk" in ran and "reduce_qk_rope_float32" not in ran, sorted(ran)
    assert "attention_float32_split_qk" not in ran_ref and "reduce_qk_rope_float32" in ran_ref, sorted(ran_ref)
    assert_same_logits(ours, ref)


@needs_coopmat
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_the_lm_head_writes_its_logits_itself_with_the_reduce_s_bits(monkeypatch, weights):
    """Outside the prefill recordings the LM head's direct tile (one K chunk: the demo model's 256)
    writes the logits itself (matmul_coop_direct.comp Y_OUT) and no reduce_rows follows; with the
    switch off, the reduce writes them. Every token's logits bit for bit either way, here 21 rows a
    decode step (a partial 16-row tile) after a first step of every prompt on the prefill recording."""
    from gemma_batch.backends.vulkan.coop_tiles import LOGITS_IN_TILE_ENV

    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 4000, int(rng.integers(2, 40))).tolist() for _ in range(21)]
    (ours, ran), (ref, ran_ref) = greedy_both_ways(
        monkeypatch, weights, prompts, lambda patch, in_tile: patch.setenv(LOGITS_IN_TILE_ENV, "1" if in_tile else "0"))
    kernel = f"coop_rows_y_out_{'t8' if weights == 'int8' else 't16'}"
    assert kernel in ran and "reduce_rows" not in ran, sorted(ran)
    assert kernel not in ran_ref and "reduce_rows" in ran_ref, sorted(ran_ref)
    assert_same_logits(ours, ref)


@needs_coopmat
def test_tiles_in_fragment_order_give_the_same_logits(monkeypatch):
    """fp16 weight tiles in the matrix units' fragment order (fragment_order.py; on where the
    probe reads that order, as on the H100's driver) against row-major tiles read by coopMatLoad:
    the same values multiplied in the same order, so identical logits, in 7-token steps (the decode
    tile, matmul_coop_direct.comp, and the embedding lookup) and in an 80-token prefill step (the
    prefill tile, matmul_coop.comp)."""
    from gemma_batch.engine.generate import generate_greedy

    runs = []
    for on in ("1", "0"):
        monkeypatch.setenv(FRAGMENT_ENV, on)
        backend = backend_for(DEMO_MODEL, coop_min_chunk=64)
        if on == "0":
            assert not backend.kernels.fragment_loads
        elif "NVIDIA" in backend.device.info.name:  # the order its driver gives (read on the H100)
            assert backend.kernels.fragment_loads
        _, logits = run_batched(backend, step_token_budget=7)
        prefill = []
        generate_greedy(backend, [list(range(3, 83))], 2, step_token_budget=128,
                        on_step=lambda _, batch, result: prefill.append(result.logits.copy()))
        runs.append((logits, prefill))
        backend.close()
    for ours, ref in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert np.array_equal(ours, ref)


@needs_coopmat
def test_the_switch_turns_the_cooperative_path_off(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    backend = backend_for(DEMO_MODEL)
    run_batched(backend, step_token_budget=7)
    assert not any(name.startswith(("coop_", "split", "reduce")) for name in backend.profile_seconds())
    assert "cooperative" not in backend.identity


@needs_coopmat
def test_fp16_inputs_stay_within_their_rounding_of_the_cpu_backend(monkeypatch):
    """GEMMA_BATCH_VK_COOPMAT_INPUTS=fp16 multiplies the hi halves alone: each input element
    rounded to 11 significant bits (relative 2^-12), so each matmul moves by up to about 2.4e-4
    of its terms' magnitude, compounded over the demo model's layers. Measured on the H100:
    logits within 3.9e-3 of the CPU backend's (largest |logit| 14.9), against 2.1e-5 for the
    split inputs; 1e-2 gives that a 2.5x margin. The lo halves really are dropped: the error
    exceeds the split's 1e-4 tolerance. Greedy completions stay the CPU backend's."""
    monkeypatch.setenv(INPUTS_ENV, "fp16")
    backend = backend_for(DEMO_MODEL)
    assert "fp16 inputs" in backend.identity
    completions, logits = run_batched(backend, step_token_budget=7)
    ref_completions, ref_logits = run_batched(cpu_backend(DEMO_MODEL), step_token_budget=7)
    err = max(float(np.abs(ours - ref).max()) for ours, ref in zip(logits, ref_logits))
    assert 1e-4 < err < 1e-2
    assert completions == ref_completions


def test_the_inputs_follow_the_kv_dtype_unless_the_switch_says(monkeypatch):
    monkeypatch.delenv(INPUTS_ENV, raising=False)
    assert split_inputs("fp32")  # fp32 pages: fp32 numerics
    assert not any(split_inputs(kv) for kv in ("fp16", "bf16", "int8"))
    monkeypatch.setenv(INPUTS_ENV, "FP16")
    assert not split_inputs("fp32")
    monkeypatch.setenv(INPUTS_ENV, "split")
    assert split_inputs("fp16")
    monkeypatch.setenv(INPUTS_ENV, "bf16")
    with pytest.raises(ValueError, match="GEMMA_BATCH_VK_COOPMAT_INPUTS='bf16': expected one of split, fp16"):
        split_inputs("fp16")


def test_negative_control_plain_fp16_inputs_miss_the_tolerance():
    """What the hi/lo split of split.comp buys, in numpy: products of bf16 weights with x rounded
    to fp16 are off by far more than the same products with hi + lo."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 1152)) * 0.05).astype(np.float32)
    w = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16 weights, exactly
    x = rng.standard_normal((8, 1152)).astype(np.float32) * 40.0
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    s = 2.0 ** (15 - np.frexp(np.abs(x).max(axis=1, keepdims=True))[1])  # split.comp's scale
    hi = (x * s).astype(np.float16).astype(np.float32)
    lo = (x * s - hi).astype(np.float16).astype(np.float32)
    split_err = np.abs((hi.astype(np.float64) + lo) @ w.T / s - exact).max() / np.abs(exact).max()
    plain_err = np.abs(hi.astype(np.float64) @ w.T / s - exact).max() / np.abs(exact).max()
    assert split_err < 1e-6
    assert plain_err > 100 * split_err
