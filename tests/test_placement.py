"""Placement plans: the `--place` text, what each device holds under a plan, and what crosses
between devices; `gemma-batch inspect --place` and the NPU line of `gemma-batch devices`."""

from __future__ import annotations

import pytest

from gemma_batch.backends.placement import Placement, PlacementError, parse_placement
from gemma_batch.bench.random_weights import layout as random_layout
from gemma_batch.bench.shapes import shape_config
from gemma_batch.engine.footprint import auto_placement, footprint, placed_bytes
from gemma_batch.model.quant import WeightFormat
from tests.test_run_job import gemma_batch


def test_layer_ranges_parts_and_both_combined():
    split = parse_placement("0-2:vulkan:0, 3-5:vulkan:1", 6)
    assert split.attention == split.ffn == ("vulkan:0",) * 3 + ("vulkan:1",) * 3
    assert (split.embed, split.head) == ("vulkan:0", "vulkan:1")
    assert split.crossings() == [("ffn 2 -> attention 3", "vulkan:0", "vulkan:1")]

    parts = parse_placement("attention=cpu,ffn=vulkan", 2)
    assert parts.attention == ("cpu", "cpu") and parts.ffn == ("vulkan:0", "vulkan:0")
    assert [c[0] for c in parts.crossings()] == ["attention 0 -> ffn 0", "ffn 0 -> attention 1",
                                                 "attention 1 -> ffn 1"]  # embed on cpu, head on vulkan:0

    both = parse_placement("0-3:vulkan:gpu-a,4-5:attention=cpu,4-5:ffn=npu,embed=cpu,head=vulkan:gpu-a", 6)
    assert both.attention == ("vulkan:gpu-a",) * 4 + ("cpu", "cpu") and both.ffn[4:] == ("npu", "npu")
    assert both.devices == ("cpu", "vulkan:gpu-a", "npu")
    assert both.describe() == ("embed: cpu; layers 0-3: vulkan:gpu-a; layers 4-5: attention cpu, ffn npu; "
                               "head: vulkan:gpu-a")
    assert Placement.single("cpu", 3).crossings() == [] and parse_placement("2:cpu,0-1:cpu", 3) == Placement.single("cpu", 3)


@pytest.mark.parametrize("text, message", [
    ("0-3:cpu", "no device for attention 4, ffn 4"),
    ("0-4:cpu,4-5:vulkan:0", "layer 4's attention is placed twice (cpu and vulkan:0)"),
    ("attention=cpu,ffn=cpu,3:ffn=npu", "layer 3's ffn is placed twice"),
    ("0-6:cpu", "layers 0-6 are not within the model's 0-5"),
    ("3-1:cpu", "layers 3-1"),
    ("0-5:gpu", "unknown device 'gpu'"),
    ("0-5:vulkan:", "unknown device 'vulkan:'"),
    ("mlp=cpu,attention=cpu", "unknown part 'mlp'"),
    ("0-5:cpu,head=cpu,head=npu", "head is placed twice"),
    ("0-5:cpu,1:embed=npu", "embed takes no layer range"),
    ("0-5:cpu,", "an empty item"),
])
def test_bad_plans_are_refused_naming_the_problem(text, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_placement(text, 6)


def shape_4b_bytes(length: int) -> tuple[int, int, int, int, dict[int, int]]:
    """Worked from the 4b shape's dimensions, independently of the code, in bf16 weights and an fp16
    KV cache: per layer, attention q/k/v/o and four norms (two of them q/k norms of head_dim) and
    feed-forward three matrices and two norms; the embedding; the final norm; each layer's KV for
    one sequence of `length` tokens (a sliding layer: its window plus a 512-token chunk, in blocks)."""
    cfg = shape_config("4b")
    h, i, nh, nkv, hd, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size
    attention = 2 * (2 * nh * hd * h + 2 * nkv * hd * h + 2 * h + 2 * hd)
    ffn = 2 * (3 * i * h + 2 * h)
    per_token_layer = 2 * nkv * hd * 2  # K and V, fp16
    window_blocks = -(-(cfg.sliding_window - 1 + 512) // 16) + 1
    kv = {layer: per_token_layer * 16 * (length // 16 if cfg.layer_types[layer] == "full_attention" else window_blocks)
          for layer in range(cfg.num_layers)}
    return attention, ffn, 2 * vocab * h, 2 * h, kv


def test_each_device_holds_its_layers_weights_and_kv():
    """The tied embedding on both ends' devices; KV per layer where its attention runs."""
    cfg = shape_config("4b")
    length = 4096
    attention, ffn, embed, final_norm, kv = shape_4b_bytes(length)
    plan = parse_placement("0-9:vulkan:0,10-33:attention=cpu,10-33:ffn=vulkan:1", cfg.num_layers)
    fp = footprint(cfg, random_layout(cfg), WeightFormat.parse("bf16", 32), "fp16")
    placed = placed_bytes(fp, plan, random_layout(cfg), length, max_chunk=512)
    assert placed["vulkan:0"][0] == 10 * (attention + ffn) + embed
    assert placed["cpu"][0] == 24 * attention
    assert placed["vulkan:1"][0] == 24 * ffn + embed + final_norm
    assert placed["vulkan:0"][1] == sum(kv[layer] for layer in range(10))
    assert placed["cpu"][1] == sum(kv[layer] for layer in range(10, 34)) and placed["vulkan:1"][1] == 0
    assert sum(w for w, _ in placed.values()) == fp.total_weight_bytes + embed  # the embedding twice


@pytest.mark.parametrize("layers_on_gpu", [0, 1, 13, 34])
def test_auto_puts_as_many_layers_as_fit_on_the_gpu_and_the_rest_on_the_cpu(layers_on_gpu):
    cfg = shape_config("4b")
    length, batch = 2048, 8
    attention, ffn, embed, final_norm, kv = shape_4b_bytes(length)
    need = embed + sum(attention + ffn + batch * kv[layer] for layer in range(layers_on_gpu))
    need += final_norm if layers_on_gpu == cfg.num_layers else 0  # the head goes with the last layer
    fp = footprint(cfg, random_layout(cfg), WeightFormat.parse("bf16", 32), "fp16")
    for budget, expected in ((need, layers_on_gpu), (need - 1, max(layers_on_gpu - 1, 0))):
        plan = auto_placement(fp, random_layout(cfg), [("vulkan:0", budget)], length, batch)
        assert plan.attention == plan.ffn == ("vulkan:0",) * expected + ("cpu",) * (cfg.num_layers - expected)
        assert plan.embed == plan.attention[0] and plan.head == plan.ffn[-1]


def test_inspect_prints_the_plan_and_refuses_a_bad_one():
    done = gemma_batch("inspect", "27b", "--place", "0-30:vulkan:0,31-61:vulkan:1", "--batch", "32")
    assert done.returncode == 0, done.stderr
    assert "placement: embed: vulkan:0; layers 0-30: vulkan:0; layers 31-61: vulkan:1; head: vulkan:1" in done.stdout
    assert "crossings: 1 a step: ffn 30 -> attention 31 (vulkan:0 -> vulkan:1); 21.0 KiB of activations a token" in done.stdout
    bad = gemma_batch("inspect", "27b", "--place", "0-30:vulkan:0")
    assert bad.returncode == 2 and "no device for attention 31" in bad.stderr
    auto = gemma_batch("inspect", "27b", "--place", "auto", "--memory", "40GiB", "--batch", "8")
    assert auto.returncode == 0 and "placement: embed: vulkan:0; layers 0-" in auto.stdout and "-61: cpu; head: cpu" in auto.stdout
    no_memory = gemma_batch("inspect", "27b", "--place", "auto")
    assert no_memory.returncode == 2 and "--place auto needs --memory" in no_memory.stderr


def test_devices_says_why_there_is_no_npu():
    done = gemma_batch("devices")
    assert "NPU: none (pyxrt (XRT's Python binding) does not import" in done.stdout or "NPU 0:" in done.stdout
