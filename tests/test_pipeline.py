"""A model run across devices (backends/pipeline.py): every kind of plan against the single-device
run, on tiny transformers-written checkpoints and on the demo model in whole jobs.

- Two CPU stages (the CPU backend under two device names) compute every row with the same
  arithmetic as one CPU backend, so the logits must be bit-identical: any lost, repeated or
  misrouted part, or a KV page read on the wrong stage, shows.
- CPU and Vulkan stages (llvmpipe in CI): the greedy tokens must equal the CPU run's, the logits
  within the Vulkan backend's own tolerance against the CPU (test_vulkan_backend.py: 1e-4 with
  fp32 KV pages on both, where only summation orders differ).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gemma_batch.backends import create_placed, resolve_placement
from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.backends.pipeline import PipelineBackend
from gemma_batch.backends.placement import Placement, parse_placement
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat
from tests.test_cpu_vs_transformers import checkpoints, cpu_backend, run_batched  # noqa: F401
from tests.test_run_job import gemma_batch, write_jsonl

# (ranges, parts of every layer, both with the ends placed apart), over devices A and B
PLANS = ["0-2:A,3-5:B", "attention=A,ffn=B", "0-1:B,2-5:attention=A,2-5:ffn=B,embed=A,head=A"]


@pytest.fixture(scope="module")
def cpu_reference(checkpoints):
    return run_batched(cpu_backend(checkpoints["bf16"][0]), step_token_budget=7)


def _named(text: str, a: str, b: str, num_layers: int) -> Placement:
    return parse_placement(text.replace("A", a).replace("B", b), num_layers)


@pytest.mark.parametrize("plan", PLANS)
def test_two_cpu_stages_give_the_single_cpu_bits(checkpoints, cpu_reference, plan):
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    placement = _named(plan, "vulkan:a", "vulkan:b", cfg.num_layers)  # (names only: both stages are CPU backends)
    stages = {d: CpuBackend(cfg, segments=[s for s in placement.segments() if s.device == d]) for d in placement.devices}
    backend = PipelineBackend(cfg, placement, stages, checkpoint.layout, WeightFormat.parse("bf16"))
    backend.load_weights(checkpoint.tensors())
    completions, logits = run_batched(backend, step_token_budget=7)
    assert completions == cpu_reference[0]
    assert all(np.array_equal(ours, ref) for ours, ref in zip(logits, cpu_reference[1]))
    held = {d: set(s.weights) for d, s in stages.items()}
    assert not held[placement.devices[0]] & held[placement.devices[1]] - {"embed_tokens.weight"}  # each part once
    assert all(set(s.k_cache) == s.kv_layers for s in stages.values())  # KV pages for its own layers only


def test_a_pipeline_of_one_wrong_part_fails_the_comparison(checkpoints, cpu_reference):
    """Negative control: a stage that skips a layer's feed-forward block is caught."""
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    placement = _named(PLANS[0], "vulkan:a", "vulkan:b", cfg.num_layers)
    stages = {d: CpuBackend(cfg, segments=[s for s in placement.segments() if s.device == d]) for d in placement.devices}
    stages["vulkan:b"]._feed_forward = lambda layer, h, out=None: (
        h if layer == 4 else CpuBackend._feed_forward(stages["vulkan:b"], layer, h, out))
    backend = PipelineBackend(cfg, placement, stages, checkpoint.layout, WeightFormat.parse("bf16"))
    backend.load_weights(checkpoint.tensors())
    _, logits = run_batched(backend, step_token_budget=7)
    assert max(np.abs(ours - ref).max() for ours, ref in zip(logits, cpu_reference[1])) > 1e-2


def test_a_stage_that_fails_to_load_fails_the_load_without_a_hang(checkpoints):
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    placement = _named(PLANS[0], "vulkan:a", "vulkan:b", cfg.num_layers)
    stages = {d: CpuBackend(cfg, segments=[s for s in placement.segments() if s.device == d]) for d in placement.devices}

    def broken(tensors):
        for i, _ in enumerate(tensors):
            if i == 1:
                raise ValueError("stage a cannot hold its second tensor")

    stages["vulkan:a"].load_weights = broken
    backend = PipelineBackend(cfg, placement, stages, checkpoint.layout, WeightFormat.parse("bf16"))
    with pytest.raises(ValueError, match="stage a cannot hold"):
        backend.load_weights(checkpoint.tensors())


def _vulkan_here() -> bool:
    try:
        from gemma_batch.backends.vulkan.device import list_devices

        return bool(list_devices())
    except Exception:  # no loader, no driver
        return False


needs_vulkan = pytest.mark.skipif(not _vulkan_here(), reason="no Vulkan device")


@needs_vulkan
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("order", ["cpu first", "vulkan first"])
def test_cpu_and_vulkan_stages_match_the_cpu_run(checkpoints, cpu_reference, plan, order):
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    a, b = ("cpu", "vulkan:0") if order == "cpu first" else ("vulkan:0", "cpu")
    placement = resolve_placement(_named(plan, a, b, cfg.num_layers))
    backend = create_placed(placement, cfg, checkpoint.layout, WeightFormat.parse("bf16"), kv_dtype="fp32")
    backend.load_weights(checkpoint.tensors())
    completions, logits = run_batched(backend, step_token_budget=7)
    assert completions == cpu_reference[0]
    assert max(np.abs(ours - ref).max() for ours, ref in zip(logits, cpu_reference[1])) < 1e-4


@needs_vulkan
def test_the_stream_crosses_between_the_cpu_and_a_gpu_without_a_host_copy(checkpoints):
    """The CPU stage writes its output into the GPU's input buffer, and reads the GPU's output
    where the GPU wrote it (the shared-memory crossing: vulkan/stage.py)."""
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    placement = resolve_placement(parse_placement("0-1:cpu,2-3:vulkan:0,4-5:cpu", cfg.num_layers))
    backend = create_placed(placement, cfg, checkpoint.layout, WeightFormat.parse("bf16"), kv_dtype="fp32")
    backend.load_weights(checkpoint.tensors())
    cpu, gpu = backend.stages["cpu"], backend.stages["vulkan:0"]
    seen = []
    for stage in (cpu, gpu):
        def spy(index, batch, x, out=None, run=stage.run_segment, stage=stage):
            result = run(index, batch, x, out)
            seen.append((stage.name, x, out, result))
            return result
        stage.run_segment = spy
    run_batched(backend, step_token_budget=7)
    for (name_a, _, out_a, result_a), (name_b, x_b, _, _) in zip(seen, seen[1:]):
        if name_a == "cpu" and name_b == "vulkan":  # the CPU wrote the GPU's x_in in place
            assert out_a is not None and np.shares_memory(result_a, out_a)
        if name_a == "vulkan" and x_b is not None and name_b == "cpu":  # the CPU read the GPU's x_out in place
            assert np.shares_memory(x_b, result_a)
    assert {name for name, *_ in seen} == {"cpu", "vulkan"}


def _vulkan_devices() -> int:
    try:
        from gemma_batch.backends.vulkan.device import list_devices

        return len(list_devices())
    except Exception:  # no loader, no driver
        return 0


@pytest.mark.skipif(_vulkan_devices() < 2, reason="fewer than two Vulkan devices")
@pytest.mark.parametrize("plan", PLANS)
def test_two_vulkan_stages_match_one_vulkan_device(checkpoints, plan):
    """On a machine with two GPUs (the device machine's nvidia-h100-x2): the same greedy tokens
    as GPU 0 alone, and logits within 1e-4 (fp32 KV; a stage's edges fuse nothing across them,
    so some sums run in another order)."""
    model_dir = checkpoints["bf16"][0]
    cfg = Gemma3Config.from_dir(model_dir)
    checkpoint = Checkpoint.open(model_dir, cfg)
    single = create_placed(resolve_placement(Placement.single("vulkan:0", cfg.num_layers)), cfg, checkpoint.layout,
                           WeightFormat.parse("bf16"), kv_dtype="fp32")
    single.load_weights(checkpoint.tensors())
    reference = run_batched(single, step_token_budget=7)
    split = create_placed(resolve_placement(_named(plan, "vulkan:0", "vulkan:1", cfg.num_layers)), cfg, checkpoint.layout,
                          WeightFormat.parse("bf16"), kv_dtype="fp32")
    assert isinstance(split, PipelineBackend) and len(split.stages) == 2
    split.load_weights(checkpoint.tensors())
    completions, logits = run_batched(split, step_token_budget=7)
    assert completions == reference[0]
    assert max(np.abs(ours - ref).max() for ours, ref in zip(logits, reference[1])) < 1e-4


def _completions(path) -> tuple[list, list]:
    table = pq.read_table(path)
    logprobs = [[t["logprob"] for t in row] for row in table.column("logprobs").to_pylist()]
    return table.column("completion").to_pylist(), logprobs


@needs_vulkan
def test_an_auto_plan_under_a_small_gpu_cap_splits_and_gives_the_single_device_output(tmp_path):
    """The demo model (about 10 MiB of bf16 weights) under --gpu-memory 14MiB (weights, fp32 KV and
    step buffers, kept small): some layers on the GPU, the rest on the CPU (or on a second GPU
    where there is one); the completions equal the CPU job's, and each token's log-probability agrees within
    1e-4 (fp32 KV pages on both: with fp16 pages on the GPU, as with the GPU alone, a near tie in
    row 3 goes the other way)."""
    rows = [{"id": i, "prompt": f"Row {i}: the weather today" + " is" * (i % 7)} for i in range(10)]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    flags = ("--max-tokens", "12", "--logprobs", "1", "--kv-dtype", "fp32")
    single = gemma_batch("run", src, *flags, "--backend", "cpu", "--output", tmp_path / "cpu.parquet")
    assert single.returncode == 0, single.stderr
    split = gemma_batch("run", src, *flags, "--place", "auto", "--device", "0", "--gpu-memory", "14MiB",
                        "--max-batch", "4", "--max-step-tokens", "64", "--output", tmp_path / "split.parquet")
    assert split.returncode == 0, split.stderr
    assert "backend: pipeline (embed: vulkan:0; layer" in split.stderr  # (the rest: the CPU, or a second GPU)
    assert "of activations cross between devices per token" in split.stderr
    (ours, our_lp), (ref, ref_lp) = _completions(tmp_path / "split.parquet"), _completions(tmp_path / "cpu.parquet")
    assert ours == ref
    assert max(abs(x - y) for a, b in zip(our_lp, ref_lp) for x, y in zip(a, b)) < 1e-4


@needs_vulkan
def test_constrained_and_scored_rows_through_a_plan_match_the_cpu_job(tmp_path):
    """Grammar masks reach the head across the plan (the engine gives them while the step runs),
    and choices are scored there: the same answers as the CPU job, log-probabilities within 1e-4
    (fp32 KV pages)."""
    rows = [{"id": i, "prompt": f"Row {i}: the weather today is", **c} for i, c in enumerate(
        [{"regex": "[a-z ]{1,20}"}, {"choices": [" sunny", " cold and wet", " warm"]}, {}, {"regex": "(yes|no)"}] * 3)]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    flags = ("--max-tokens", "10", "--kv-dtype", "fp32")
    runs = {}
    for name, where in (("cpu", ("--backend", "cpu")), ("placed", ("--place", "0-2:vulkan:0,3-4:cpu,5:vulkan:0"))):
        done = gemma_batch("run", src, *flags, *where, "--output", tmp_path / f"{name}.parquet")
        assert done.returncode == 0, done.stderr
        runs[name] = pq.read_table(tmp_path / f"{name}.parquet").to_pylist()
    assert [r["completion"] for r in runs["placed"]] == [r["completion"] for r in runs["cpu"]]
    for ours, ref in zip(runs["placed"], runs["cpu"]):
        if ref["choice_logprobs"]:
            assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(ours["choice_logprobs"], ref["choice_logprobs"])) < 1e-4


@needs_vulkan
def test_a_placed_job_killed_mid_run_resumes_to_the_same_file(tmp_path):
    import signal
    import time

    rows = [{"id": f"k{i}", "prompt": f"Row {i}: the weather today" + " is" * (i % 11)} for i in range(24)]
    src = write_jsonl(tmp_path / "kill.jsonl", rows)  # (llvmpipe takes about 0.2 s a step here: few steps)
    flags = ("--place", "0-2:vulkan:0,3-5:cpu", "--temperature", "0.8", "--max-tokens", "12", "--max-batch", "4")
    reference = gemma_batch("run", src, *flags, "--output", tmp_path / "reference.parquet", timeout=300)
    assert reference.returncode == 0, reference.stderr
    target = tmp_path / "killed.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *flags, "--output", str(target)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = target.with_name(target.name + ".partial") / "pending.jsonl"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not (journal.exists() and journal.read_bytes().count(b"\n") >= 3):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not target.exists()  # killed before the end
    final = gemma_batch("run", src, *flags, "--output", target, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "resuming: " in final.stderr and "resuming: 0 " not in final.stderr
    assert target.read_bytes() == (tmp_path / "reference.parquet").read_bytes()


@pytest.mark.parametrize("memory_gib", [79.2, 40.0, 24.0])
def test_auto_keeps_a_model_that_fits_on_one_gpu_and_splits_one_that_does_not(memory_gib):
    """27b bf16 with the job's defaults: as many layers on the GPU as fit in 90% of its memory,
    less the step buffers, beside the KV of one 8,192-token sequence (16-token blocks; a sliding
    layer keeps its 1,024-token window plus a 512-token step), counted here from the tensor
    shapes; the rest on the CPU. An 80 GB GPU holds the whole model."""
    import math
    import types
    from gemma_batch.bench.random_weights import layout as random_layout
    from gemma_batch.bench.shapes import shape_config
    from gemma_batch.job.devices import _step_buffer_bytes, plan_gpus
    from gemma_batch.job.spec import JobSpec

    cfg, spec = shape_config("27b"), JobSpec(input=Path("rows.jsonl"))
    layout = random_layout(cfg)
    gpu = types.SimpleNamespace(index=0, name="GPU", device_local_bytes=int(memory_gib * 2**30), coopmat_fp16=True, sm_count=132)
    placement, _ = plan_gpus(spec, cfg, layout, [gpu], None)

    def bf16_bytes(prefix: str) -> int:
        return sum(2 * math.prod(shape) for name, (_, shape) in layout.items() if name.startswith(prefix))

    def kv_bytes(layer: int) -> int:
        tokens = 8192 if cfg.layer_types[layer] == "full_attention" else 16 * (-(-(cfg.sliding_window - 1 + 512) // 16) + 1)
        return tokens * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, fp16

    budget = int(gpu.device_local_bytes * 0.9) - _step_buffer_bytes(cfg, gpu, spec, 8192)
    held, layers = bf16_bytes("embed_tokens.") + bf16_bytes("norm."), 0
    while layers < cfg.num_layers and held + bf16_bytes(f"layers.{layers}.") + kv_bytes(layers) <= budget:
        held, layers = held + bf16_bytes(f"layers.{layers}.") + kv_bytes(layers), layers + 1
    assert placement.ffn.count("vulkan:0") == placement.attention.count("vulkan:0") == layers
    assert placement.devices == (("vulkan:0",) if layers == cfg.num_layers else ("vulkan:0", "cpu"))
    assert (layers == cfg.num_layers) == (memory_gib > 70)


def test_the_npu_stops_the_job_before_loading_saying_why(tmp_path):
    src = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello"}])
    done = gemma_batch("run", src, "--place", "0-2:npu,3-5:cpu")
    assert done.returncode == 2
    assert "--place names the NPU, but" in done.stderr and "model:" not in done.stderr
    assert not (tmp_path / "rows.jsonl.completions.parquet").exists()


def test_a_toml_job_takes_its_plan(tmp_path):
    """`place` in a TOML job reaches the job: here the NPU, which stops it before loading."""
    write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello"}])
    job = tmp_path / "job.toml"
    job.write_text('input = "rows.jsonl"\nplace = "attention=npu,ffn=cpu"\n', encoding="utf-8")
    done = gemma_batch("run", job)
    assert done.returncode == 2 and "--place names the NPU, but" in done.stderr, done.stderr


@pytest.mark.parametrize("flags, message", [
    (("--place", "0-2:cpu"), "no device for attention 3"),
    (("--place", "0-3:cpu,3-5:cpu"), "layer 3's attention is placed twice"),
    (("--place", "0-5:tpu"), "unknown device 'tpu'"),
    (("--place", "0-5:cpu", "--backend", "cpu"), "--place names the devices itself"),
    (("--gpu-memory", "50%"), "--gpu-memory '50%': expected a size"),
])
def test_bad_plans_are_refused_with_a_clear_message(tmp_path, flags, message):
    src = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello"}])
    done = gemma_batch("run", src, *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr
