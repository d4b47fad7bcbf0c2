"""Decode step time with attention_float16_split swapped for experimental builds (attn_NAME.spv).
usage: sweep.py SHAPE BATCHES NAMES [gen]"""
import sys
from pathlib import Path
from common import median_step, swap
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
shape, batches, names = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3].split(",")
gen = int(sys.argv[4]) if len(sys.argv) > 4 else 48
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for rep in range(2):
    for name in names:
        swap(backend, "attention_float16_split", HERE / f"attn_{name}.spv")
        for batch in batches:
            step = median_step(backend, batch, gen)
            print(f"{shape} b{batch} gen{gen} attn {name}: {step*1e3:.3f} ms/step", flush=True)
