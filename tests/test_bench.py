"""`gemma-batch bench`: its JSON report on both backends, the roofline arithmetic worked out by hand,
the random weights, and the shapes against transformers and the published parameter counts.

No assertion is on speed: benchmarks are measured, not tested. What is tested is that every
figure is derived as documented from the run's own counts, bytes and bandwidth.
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from transformers import Gemma3TextConfig

from gemma_batch.backends.base import StepBatch
from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.backends.cpu_math import MAX_THREADS
from gemma_batch.bench.metrics import (CaseRun, StepTiming, case_metrics, decode_kv_bytes, prefill_flops,
                                      roofline_tokens_per_s, slow_steps)
from gemma_batch.bench.random_checkpoint import write_random_checkpoint
from gemma_batch.bench.random_weights import random_tensors, weight_bytes
from gemma_batch.bench.runner import BenchError, BenchOptions, run_bench
from gemma_batch.bench.shapes import SHAPES, shape_config
from gemma_batch.model.checkpoint import Checkpoint, to_float32
from gemma_batch.model.config import FULL, SLIDING, Gemma3Config, KVGroup
from gemma_batch.model.quant import QuantizedTensor, WeightFormat
from gemma_batch.model.conversion import convert
from gemma_batch.model.tokenizer import Tokenizer
from gemma_batch.model.weights import tensor_shapes
from tests.test_run_job import gemma_batch

RUN_FIELDS = {
    "date", "command", "backend", "backend_choice", "shape", "weights_source", "config", "weights", "kv_dtype", "seed",
    "block_size",
    "weight_bytes", "weight_bytes_by_dtype", "weight_load_s", "kv_bytes_per_token", "bandwidth_test_bytes",
    "bandwidth_bytes_per_s",
}
CASE_FIELDS = {
    "batch", "prompt_len", "gen_len", "step_token_budget", "steps", "prefill_steps", "decode_steps", "prefill_tokens",
    "generated_tokens", "preemptions", "wall_s", "e2e_tokens_per_s", "prefill_tokens_per_s", "prefill_tflops", "ttft_mean_s",
    "ttft_max_s", "decode_tokens_per_s", "decode_step_ms_median", "decode_device_ms_median", "decode_step_ms_mean",
    "decode_device_ms_mean", "decode_step_ms_max", "slow_decode_steps", "slow_decode_steps_on_device",
    "host_ms_per_decode_step", "host_percent_of_device", "peak_memory_bytes", "mean_decode_context",
    "kv_bytes_per_decode_step", "decode_bytes_per_step", "roofline_decode_tokens_per_s", "bandwidth_fraction",
}
# tiny, by hand: embedding 512*64 = 32768; a layer: 4 norms of 64, q 64*64, k and v 32*64 each, q/k norms of 16,
# o 64*64, gate/up/down 128*64 each = 37152, times 4 layers; final norm 64. Tied head: no more.
TINY_PARAMS = 32768 + 4 * 37152 + 64
# The same in the quantized formats. A layer's matrices [N, K]: q and o 64x64, k and v 32x64, gate and up 128x64,
# down 64x128: 36864 weights in 512 rows. The embedding 512x64. Norms 4 * (4*64 + 2*16) + 64 = 1216, bf16 always.
# int8: N*K codes + a 2-B scale per 32 weights; int4: the embedding int8.
TINY_NORM_BYTES = 2 * 1216
TINY_EMBED_INT8 = 512 * 64 + 2 * 512 * 64 // 32
TINY_INT8 = TINY_EMBED_INT8 + 4 * (36864 + 2 * 36864 // 32) + TINY_NORM_BYTES
# int4 (min8, quant.py): a row's low 4 bits (K/2 bytes), then 4 bytes of steps, int5's fifth bits (K/8), a 2-B pair
# per group, padding to 4 bytes. q, k, v, gate and up (384 rows, K 64) int5 in groups of 64: 32 + 4 + 8 + 2 + 2 = 48
# bytes a row; o (64 rows, K 64) int4 in groups of 32: 32 + 4 + 4 = 40; down (64 rows, K 128): 64 + 4 + 8 = 76.
TINY_INT4_MIN8 = TINY_EMBED_INT8 + 4 * (48 * 384 + 40 * 64 + 76 * 64) + TINY_NORM_BYTES
PROMPT, GEN = 12, 6


def run_bench_cli(tmp_path, backend: str, batches: str, *options: str) -> tuple[dict, str]:
    out = tmp_path / f"{backend}.json"
    done = gemma_batch("bench", "--shape", "tiny", "--backend", backend, "--batch", batches, "--prompt-len", PROMPT,
                       "--gen-len", GEN, "--bandwidth-bytes", 8 << 20, "--json", out, *options, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stdout


def check_report(report: dict, stdout: str, backend: str, batches: list[int], kv_bytes_per_token: int,
                 weights: str = "bf16", kv_dtype: str = "", weight_bytes: int = 2 * TINY_PARAMS) -> None:
    run, cases = report["run"], report["cases"]
    assert set(run) == RUN_FIELDS and all(set(case) == CASE_FIELDS for case in cases)
    assert run["shape"] == "tiny" and run["weights"] == weights and run["config"] == SHAPES["tiny"]
    assert run["weights_source"] == "random"
    assert run["kv_dtype"] == kv_dtype
    assert run["backend"].startswith(backend) and run["command"].startswith("gemma-batch bench --shape tiny")
    assert datetime.datetime.fromisoformat(run["date"]).tzinfo is not None
    shapes = tensor_shapes(shape_config("tiny"))
    assert TINY_PARAMS == sum(math.prod(s) for s in shapes.values())
    assert run["weight_bytes"] == weight_bytes == sum(run["weight_bytes_by_dtype"].values())
    assert run["bandwidth_test_bytes"] == 8 << 20 and run["bandwidth_bytes_per_s"] > 0
    assert run["kv_bytes_per_token"] == {FULL: kv_bytes_per_token, SLIDING: kv_bytes_per_token}
    for word in ("shape tiny", f"random {weights} weights", f"KV cache {kv_dtype}", f"device: {run['backend']}", "GB/s",
                 "decode tok/s", "bw fraction"):
        assert word in stdout

    assert [c["batch"] for c in cases] == batches
    for c in cases:
        b = c["batch"]
        assert (c["prompt_len"], c["gen_len"], c["step_token_budget"]) == (PROMPT, GEN, b * PROMPT)
        assert c["prefill_tokens"] == b * PROMPT and c["generated_tokens"] == b * GEN and c["preemptions"] == 0
        # Every prompt in one step, then the batch decodes in lockstep: one step per further token.
        assert (c["steps"], c["prefill_steps"], c["decode_steps"]) == (GEN, 1, GEN - 1)
        assert c["e2e_tokens_per_s"] == pytest.approx(b * GEN / c["wall_s"], rel=1e-12)
        assert 0 < c["ttft_mean_s"] <= c["ttft_max_s"] < c["wall_s"]
        assert c["ttft_max_s"] >= b * PROMPT / c["prefill_tokens_per_s"] * (1 - 1e-12)  # at least the prefill step
        # KV read per decode step, at the mean context 12 + 6/2 = 15: the global layers see 15 tokens,
        # the sliding ones their window of 8.
        assert c["mean_decode_context"] == 15
        assert c["kv_bytes_per_decode_step"] == b * (15 + 8) * kv_bytes_per_token
        assert c["decode_bytes_per_step"] == run["weight_bytes"] + c["kv_bytes_per_decode_step"]
        roofline = b * run["bandwidth_bytes_per_s"] / c["decode_bytes_per_step"]
        assert c["roofline_decode_tokens_per_s"] == pytest.approx(roofline, rel=1e-12)
        assert c["bandwidth_fraction"] == pytest.approx(c["decode_tokens_per_s"] / roofline, rel=1e-12)
        assert c["decode_tokens_per_s"] > 0 and c["decode_step_ms_median"] > 0


def test_bench_on_cpu_reports_every_figure_derived_from_its_own_counts(tmp_path):
    report, stdout = run_bench_cli(tmp_path, "cpu", "1,3")
    # 2 layers a group, K+V, 2 heads of 16, fp32
    check_report(report, stdout, "cpu", [1, 3], kv_bytes_per_token=2 * 2 * 2 * 16 * 4, kv_dtype="fp32")
    for c in report["cases"]:
        assert c["decode_device_ms_median"] is c["host_ms_per_decode_step"] is c["host_percent_of_device"] is None
        # fp32 weights plus the KV arrays: per group 3 blocks a sequence (ceil(18 / 16) = 2, and a spare) of 16 slots.
        assert c["peak_memory_bytes"] == 4 * TINY_PARAMS + 2 * 3 * c["batch"] * 16 * 512
    assert "n/a" in stdout


def test_bench_on_vulkan_reports_device_and_host_time(tmp_path):
    report, stdout = run_bench_cli(tmp_path, "vulkan", "1,2")
    check_report(report, stdout, "vulkan", [1, 2], kv_bytes_per_token=2 * 2 * 2 * 16 * 2, kv_dtype="fp16")  # fp16 pages
    for c in report["cases"]:
        assert c["decode_device_ms_median"] > 0 and c["host_ms_per_decode_step"] is not None
        assert c["host_percent_of_device"] == pytest.approx(
            100 * c["host_ms_per_decode_step"] / c["decode_device_ms_median"], rel=1e-12)
        assert c["peak_memory_bytes"] >= report["run"]["weight_bytes"] + 2 * 3 * c["batch"] * 16 * 256


@pytest.mark.parametrize("weights, options, kv_dtype, kv_value_bytes, expected_weight_bytes", [
    ("int8-g32", ("--weights", "int8"), "bf16", 2 * 16 * 2, TINY_INT8),  # per layer's K (or V): 2 heads of 16
    ("int4-g32+min8", ("--weights", "int4", "--int4-group", "32"), "int8", 2 * 16 + 4 * 2, TINY_INT4_MIN8),  # + fp32 scales
])
def test_bench_on_cpu_runs_quantized_weights_and_counts_their_bytes(tmp_path, weights, options, kv_dtype,
                                                                     kv_value_bytes, expected_weight_bytes):
    """Every decode step counts the format's bytes (codes + scales, the embedding int8 under int4, the norms bf16)
    and the KV dtype's, worked out by hand from the shapes above; the CPU holds the quantized matrices as they are."""
    report, stdout = run_bench_cli(tmp_path, "cpu", "1,2", *options, "--kv-dtype", kv_dtype)
    kv_per_token = 2 * 2 * kv_value_bytes  # 2 layers a group, K and V
    check_report(report, stdout, "cpu", [1, 2], kv_per_token, weights, kv_dtype, expected_weight_bytes)
    for c in report["cases"]:
        # The CPU widens the bf16 norms to float32 (TINY_NORM_BYTES more), and with more than one thread holds two
        # float32 buffers of the largest layer matrix (128x64) to widen the quantized ones; KV: per group 3 blocks a
        # sequence of 16.
        threads = min(MAX_THREADS, len(os.sched_getaffinity(0)))
        held = expected_weight_bytes + TINY_NORM_BYTES + (2 * 4 * 128 * 64 if threads > 1 else 0)
        assert c["peak_memory_bytes"] == held + 2 * 3 * c["batch"] * 16 * kv_per_token


@pytest.mark.parametrize("weights, group", [("int8", 32), ("int4", 32), ("int4", 64)])
def test_quantized_weight_bytes_of_the_1b_by_hand(weights, group):
    """1b: hidden 1152, intermediate 6912, 26 layers, 4 query heads and 1 KV head of 256, vocab 262144."""
    h, i, q, kv, layers, vocab = 1152, 6912, 4 * 256, 256, 26, 262144
    layer = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]  # [N, K]
    norms = layers * (4 * h + 2 * 256) + h

    def int8(n: int, k: int) -> int:
        return n * k + 2 * n * k // 32

    def int4(n: int, k: int) -> int:
        return n * k // 2 + 4 * n * k // group

    def min8(n: int, k: int, bits: int, g: int) -> int:  # low 4 bits, then 4 bytes of steps, fifth bits, pairs
        return n * (k // 2 + -(-(4 + (k // 8 if bits == 5 else 0) + 2 * k // g) // 4) * 4)

    if weights == "int4" and group == 32:  # q/k/v int5 in groups of 64, gate/up of 128 (1152 = 9 x 128), o/down int4
        matrices = [min8(q, h, 5, 64), min8(kv, h, 5, 64), min8(kv, h, 5, 64), min8(h, q, 4, 32),
                    min8(i, h, 5, 128), min8(i, h, 5, 128), min8(h, i, 4, 32)]
    else:
        matrices = [(int8 if weights == "int8" else int4)(n, k) for n, k in layer]
    expected = int8(vocab, h) + layers * sum(matrices) + 2 * norms
    assert weight_bytes(shape_config("1b"), WeightFormat.parse(weights, group)) == expected


def test_bench_times_a_model_folder_with_its_own_weights(tmp_path, monkeypatch):
    """--model: the folder's config and weights (the tiny shape's, written as a checkpoint), their
    bytes counted as the same shape's random ones in each format; a folder that is no model fails."""
    monkeypatch.setenv("GEMMA_BATCH_CACHE_DIR", str(tmp_path / "cache"))
    folder = write_random_checkpoint("tiny", tmp_path / "tiny")
    options = BenchOptions(batches=(2,), prompt_len=PROMPT, gen_len=GEN, backend="cpu", bandwidth_bytes=8 << 20,
                           model=str(folder))
    log = io.StringIO()
    run = run_bench(options, log=log)["run"]
    assert (run["shape"], run["weights_source"], run["weights"]) == (str(folder), "checkpoint", "bf16")
    assert run["config"] == {key: SHAPES["tiny"][key] for key in run["config"]}
    assert run["weight_bytes"] == 2 * TINY_PARAMS and "weights: checkpoint" in log.getvalue()
    report = run_bench(replace(options, weights=WeightFormat.parse("int8")), log=io.StringIO())
    assert report["run"]["weights"] == "int8-g32" and report["run"]["weight_bytes"] == TINY_INT8
    assert report["cases"][0]["generated_tokens"] == 2 * GEN
    with pytest.raises(ValueError, match="does not exist"):
        run_bench(replace(options, model=str(tmp_path / "nothing")), log=io.StringIO())


def test_a_backend_without_the_format_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(CpuBackend, "weight_formats", ("bf16",))
    with pytest.raises(BenchError, match="the cpu backend cannot run int8 weights"):
        run_bench(BenchOptions("tiny", (1,), 4, 2, "cpu", weights=WeightFormat.parse("int8")))


def test_bad_options_are_usage_errors():
    assert gemma_batch("bench", "--shape", "3b").returncode == 2
    assert gemma_batch("bench", "--batch", "1,x").returncode == 2
    for option, value, message in [("--weights", "int3", "unknown weight format 'int3'"),
                                   ("--int4-group", "48", "int4 group size must be one of"),
                                   ("--kv-dtype", "fp8", "'fp8' is not one of fp32")]:
        extra = ("--weights", "int4") if option == "--int4-group" else ()
        done = gemma_batch("bench", "--shape", "tiny", "--backend", "cpu", *extra, option, value)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = gemma_batch("bench", "--shape", "tiny", "--backend", "cpu", "--prompt-len", "4000", "--gen-len", "200")
    assert done.returncode == 1 and "exceed the tiny context of 4096" in done.stderr


def test_decode_kv_bytes_by_hand():
    groups = (KVGroup(FULL, (5, 11), None), KVGroup(SLIDING, (0, 1, 2, 3, 4, 6), 512))
    per_token = {FULL: 1000, SLIDING: 300}
    # Past the window: 4 sequences x (600.5 global tokens x 1000 B + 512 window tokens x 300 B).
    assert decode_kv_bytes(groups, per_token, 4, 600.5) == 4 * (600_500 + 153_600) == 3_016_400
    # Inside the window, both groups see every token.
    assert decode_kv_bytes(groups, per_token, 4, 100) == 4 * 100 * 1300
    assert roofline_tokens_per_s(8, 2_000_000_000, 3e12) == 12_000


def test_case_metrics_by_hand():
    steps = [  # a prefill step sampling both first tokens, then three decode steps
        StepTiming(0.100, 0.100, 0.080, 16, 2, 2),
        StepTiming(0.110, 0.010, 0.008, 0, 2, 0),
        StepTiming(0.140, 0.030, 0.020, 0, 2, 0),
        StepTiming(0.160, 0.020, 0.019, 0, 2, 0),
    ]
    run = CaseRun(2, 8, 4, 16, steps, 16, 8, 0, 12345)
    groups = (KVGroup(FULL, (1,), None), KVGroup(SLIDING, (0,), 8))
    m = case_metrics(run, groups, {FULL: 100, SLIDING: 100}, weight_bytes=10_000, bandwidth=1e6)
    assert m["prefill_tokens_per_s"] == pytest.approx(160)  # 16 tokens in 0.1 s
    assert m["prefill_tflops"] is None  # no FLOPs given
    m = case_metrics(run, groups, {FULL: 100, SLIDING: 100}, weight_bytes=10_000, bandwidth=1e6, flops_per_prompt=3e12)
    assert m["prefill_tflops"] == pytest.approx(2 * 3e12 / 0.1 / 1e12)  # two prompts in 0.1 s
    assert m["ttft_mean_s"] == m["ttft_max_s"] == 0.1
    assert m["decode_tokens_per_s"] == pytest.approx(6 / 0.06)
    assert m["e2e_tokens_per_s"] == pytest.approx(8 / 0.16)
    assert m["decode_step_ms_median"] == pytest.approx(20) and m["decode_device_ms_median"] == pytest.approx(19)
    assert m["host_ms_per_decode_step"] == pytest.approx(2)  # median of 2, 10, 1 ms
    assert m["host_percent_of_device"] == pytest.approx(100 * 2 / 19)
    assert m["mean_decode_context"] == 10 and m["kv_bytes_per_decode_step"] == 2 * (10 + 8) * 100
    assert m["decode_bytes_per_step"] == 13_600
    assert m["roofline_decode_tokens_per_s"] == pytest.approx(2 * 1e6 / 13_600)
    assert m["bandwidth_fraction"] == pytest.approx(100 / (2e6 / 13_600))
    assert (m["steps"], m["prefill_steps"], m["decode_steps"], m["peak_memory_bytes"]) == (4, 1, 3, 12345)
    assert m["decode_step_ms_mean"] == pytest.approx(20) and m["decode_device_ms_mean"] == pytest.approx(47 / 3)
    assert m["decode_step_ms_max"] == pytest.approx(30)
    # 30 ms > 1.2 x 20 (the median); its device time, 20 ms, is not over 1.2 x 19: the host made it slow
    assert (m["slow_decode_steps"], m["slow_decode_steps_on_device"]) == (1, 0)


@pytest.mark.parametrize("prompt_len", [1, 7, 40])
def test_prefill_flops_counted_token_by_token(prompt_len):
    """The closed form against a count over every matrix the model stores and every (query, key)
    pair the masks let through, on a shape whose sliding window (8) is shorter than some prompts."""
    cfg = shape_config("tiny")
    per_layer = [shape for name, shape in tensor_shapes(cfg).items()
                 if name.startswith("layers.0.") and len(shape) == 2]  # the layer's matrices, not its norms
    linear = 2 * sum(math.prod(s) for s in per_layer) * cfg.num_layers * prompt_len
    pairs = sum(min(t + 1, cfg.sliding_window) if kind == SLIDING else t + 1
                for kind in cfg.layer_types for t in range(prompt_len))
    attention = 2 * 2 * cfg.num_heads * cfg.head_dim * pairs  # Q.K^T and P.V: a multiply-add each per head dim
    lm_head = 2 * cfg.vocab_size * cfg.hidden_size
    assert prefill_flops(cfg, prompt_len) == linear + attention + lm_head


def test_slow_steps_tell_the_host_from_the_device():
    decode = [StepTiming(0.01 * i, 0.010, 0.0095, 0, 4, 0) for i in range(1, 8)]
    decode += [StepTiming(0.09, 0.013, 0.0095, 0, 4, 0),   # the host made it slow: 13 > 12 ms, device as usual
               StepTiming(0.10, 0.0125, 0.0120, 0, 4, 0),  # the device: 12 > 1.2 x 9.5 = 11.4 ms
               StepTiming(0.11, 0.0119, 0.0119, 0, 4, 0)]  # 11.9 ms is not over 1.2 x 10: not slow at all
    assert slow_steps(decode) == (2, 1)
    assert slow_steps([replace(s, device_s=None) for s in decode]) == (2, None)
    assert slow_steps([]) == (0, None)


def test_host_time_of_steps_submitted_ahead_is_not_negative():
    """A step whose wall time is below its GPU time (its GPU work began during the call before)
    exposed no host time: it counts 0, so the median cannot print as -0.00 ms."""
    steps = [StepTiming(0.100, 0.100, 0.080, 16, 2, 2),
             StepTiming(0.110, 0.010, 0.012, 0, 2, 0),   # wall 10 ms, GPU 12: -2 ms -> 0
             StepTiming(0.120, 0.010, 0.011, 0, 2, 0),   # -1 ms -> 0
             StepTiming(0.135, 0.015, 0.010, 0, 2, 0)]   # 5 ms
    run = CaseRun(2, 8, 4, 16, steps, 16, 8, 0, 1)
    m = case_metrics(run, (KVGroup(FULL, (0,), None),), {FULL: 100}, weight_bytes=10_000, bandwidth=1e6)
    assert m["host_ms_per_decode_step"] == 0.0  # median of 0, 0, 5 ms (not of -2, -1, 5: -1)
    assert m["host_percent_of_device"] == 0.0


def test_random_weights_have_every_tensor_in_bf16_with_the_stated_spread():
    cfg = shape_config("tiny")
    tensors = dict(random_tensors(cfg, seed=3))
    assert {n: t.data.shape for n, t in tensors.items()} == tensor_shapes(cfg)
    assert all(t.dtype == "BF16" and t.data.dtype == np.uint16 for t in tensors.values())
    values = {n: to_float32(t) for n, t in tensors.items()}
    assert all(np.isfinite(v).all() for v in values.values())
    assert np.std(values["embed_tokens.weight"]) == pytest.approx(0.02, rel=0.05)
    norms = np.concatenate([v for v in values.values() if v.ndim == 1])
    assert np.std(norms) == pytest.approx(0.1, rel=0.15)
    q, k = values["layers.0.self_attn.q_proj.weight"], values["layers.1.self_attn.q_proj.weight"]
    assert not np.array_equal(q, k)  # each tensor its own slice of the pool
    again = dict(random_tensors(cfg, seed=3))
    assert all(np.array_equal(again[n].data, t.data) for n, t in tensors.items())


@pytest.mark.parametrize("weights, group", [("fp16", 32), ("int8", 32), ("int4", 32), ("int4", 64)])
def test_random_weights_in_a_format_are_what_conversion_gives_the_backend(weights, group):
    """Same types, formats, dtypes and shapes as `conversion.convert` makes of the bf16 tensors; big arrays are views
    of the pools; a CPU backend loads them and computes finite logits of ordinary size."""
    cfg, fmt = shape_config("tiny"), WeightFormat.parse(weights, group)
    tensors = dict(random_tensors(cfg, 1, fmt))
    for name, bf16 in random_tensors(cfg, 1):
        want, got = convert(name, bf16, fmt), tensors[name]
        assert type(got) is type(want)
        if isinstance(want, QuantizedTensor):
            assert got.format == want.format and got.shape == want.shape
            assert (got.q.dtype, got.q.shape, got.scales.dtype, got.scales.shape) == \
                (want.q.dtype, want.q.shape, want.scales.dtype, want.scales.shape)
            assert got.q.base is not None and got.scales.base is not None  # views, no copies
            values = got.dequantize()
        else:
            assert (got.dtype, got.data.dtype, got.data.shape) == (want.dtype, want.data.dtype, want.data.shape)
            values = to_float32(got)
        assert np.isfinite(values).all() and np.abs(values).max() < 1
    if fmt.name == "int4":
        assert tensors["embed_tokens.weight"].format == WeightFormat.parse("int8")  # the embedding (the LM head) stays int8
    held = sum(t.nbytes if isinstance(t, QuantizedTensor) else t.data.nbytes for t in tensors.values())
    assert held == weight_bytes(cfg, fmt)  # the bytes bench counts are the bytes it loads

    backend = CpuBackend(cfg)
    backend.load_weights(tensors.items())
    backend.allocate_kv({FULL: 1, SLIDING: 1}, 16)
    n = 8
    step = StepBatch(np.arange(2, 2 + n, dtype=np.int32), np.arange(n, dtype=np.int32), np.array([0, n], np.int32),
                     np.array([n], np.int32), {g: np.zeros((1, 1), np.int32) for g in (FULL, SLIDING)},
                     {g: np.arange(n, dtype=np.int32) for g in (FULL, SLIDING)}, np.array([True]), return_logits=True)
    logits = backend.step(step).logits
    assert logits.shape == (n, cfg.vocab_size) and np.isfinite(logits).all() and 0 < np.abs(logits).max() < 1e3


def test_weight_bytes_match_the_published_parameter_counts():
    # gemma3_spec.md §1: keras-hub's counts (vocab 262144) 999,885,952 (1B), 3,880,099,328 (4B text),
    # 11,765,788,416 (12B text); the 4B/12B checkpoints have 64 more embedding rows (vocab 262208).
    assert weight_bytes(shape_config("1b")) == 2 * 999_885_952
    assert weight_bytes(shape_config("4b")) == 2 * (3_880_099_328 + 64 * 2560)
    assert weight_bytes(shape_config("12b")) == 2 * (11_765_788_416 + 64 * 3840)


@pytest.mark.parametrize("name", list(SHAPES))
def test_shapes_resolve_as_transformers_resolves_them(name):
    """The peer builds its model from the same dict: both sides must run the same shape."""
    theirs = Gemma3TextConfig(**SHAPES[name]).to_dict()
    assert Gemma3Config.from_dict({**theirs, "architectures": ["Gemma3ForCausalLM"]}) == shape_config(name)


def test_a_random_checkpoint_loads_as_a_real_one(tmp_path):
    """`write_random_checkpoint`'s directory is read by the checkpoint loader like a Hugging Face
    one: the shape's config (but the last id as end of sequence, past the tokenizer's 4,096 pieces at
    every real shape), every tensor under its Hugging Face name with `random_tensors`' values;
    written again, it is kept."""
    directory = write_random_checkpoint("tiny", tmp_path / "tiny")
    cfg = Gemma3Config.from_dir(directory)
    assert replace(cfg, eos_token_ids=()) == replace(shape_config("tiny"), eos_token_ids=())
    assert cfg.eos_token_ids == (cfg.vocab_size - 1,)
    assert Tokenizer.from_file(directory / "tokenizer.model").vocab_size < shape_config("1b").vocab_size
    loaded = dict(Checkpoint.open(directory, cfg).tensors())
    expected = dict(random_tensors(cfg))
    assert loaded.keys() == expected.keys()
    assert all(np.array_equal(loaded[n].data, expected[n].data) and loaded[n].dtype == expected[n].dtype for n in loaded)
    written = (directory / "model.safetensors").stat().st_mtime_ns
    write_random_checkpoint("tiny", directory)
    assert (directory / "model.safetensors").stat().st_mtime_ns == written
