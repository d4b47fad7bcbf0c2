"""Per build of attention_float16_split (attn_NAME.spv): the median decode step (wall) and the
attention kernel's GPU time per step (profile timestamps), 128-token prompts, 40 new tokens.
usage: psweep.py SHAPE BATCHES NAMES [attention chunk]"""
import sys
from pathlib import Path
import numpy as np
from common import median_step, swap
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
NAME = "attention_float16_split"
shape, batches, names = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3].split(",")
cfg = shape_config(shape)
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 64
backend = VulkanBackend(cfg, profile=True, attention_chunk=chunk)
backend.load_weights(random_tensors(cfg, 0))
for name in names:
    swap(backend, NAME, HERE / f"attn_{name}.spv")
    for batch in batches:
        kernels: dict[str, list[float]] = {}  # GPU seconds per step, by kernel
        def record():
            for k, v in backend.profile_seconds().items():
                kernels.setdefault(k, []).append(v)
        step = median_step(backend, batch, 40, record)
        attn = float(np.median(kernels.get(NAME, [0.0] * 5)[4:]))
        top = sorted(((float(np.median(v[4:])), k) for k, v in kernels.items()), reverse=True)[:6]
        print(f"{shape} b{batch} chunk{chunk} {name}: step {step*1e3:.3f} ms, attention GPU {attn*1e3:.3f} ms/step"
              f" ({attn*1e6/cfg.num_layers:.1f} us/layer); " + ", ".join(f"{k} {v*1e3:.3f}" for v, k in top), flush=True)
