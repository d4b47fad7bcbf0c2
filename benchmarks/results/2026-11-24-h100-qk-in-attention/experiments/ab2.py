"""Median decode step per build: 'reduce' (the recording with qkv's reduce) and fused builds
(attention_float16_split_qk swapped for files here), two rounds; then per-kernel GPU time of a
decode step (profile timestamps) for the reduce recording and the shipped fused one.
usage: ab2.py SHAPE BATCHES 'label:file.spv;...' [gen]"""
import os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import median_step, use_build
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.graph import StepGraph
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
NAME = "attention_float16_split_qk"
shape, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
builds = [("reduce", None)] + [(l, f) for l, f in (b.split(":") for b in sys.argv[3].split(";") if b)]
gen = int(sys.argv[4]) if len(sys.argv) > 4 else 64
state = {"fused": True}
orig = StepGraph.command_buffer
StepGraph.command_buffer = lambda self, T, S: orig(self, T, S if state["fused"] else -1)
cfg = shape_config(shape)
spec = [(l, [[NAME, f]] if f else []) for l, f in builds]
for profile in (False, True)[:1 if os.environ.get("NOPROFILE") else 2]:
    backend = VulkanBackend(cfg, profile=profile)
    backend.load_weights(random_tensors(cfg, 0))
    for rep in range(1 if profile else 2):
        for label, swaps in (spec if not profile else spec[:2]):
            state["fused"] = label != "reduce"
            use_build(backend, spec, swaps, HERE)
            for batch in batches:
                if not profile:
                    print(f"{shape} b{batch} {label}: {median_step(backend, batch, gen)*1e3:.3f} ms/step", flush=True)
                    continue
                per = {}
                def grab():
                    for k, v in backend.profile_seconds().items():
                        per.setdefault(k, []).append(v)
                median_step(backend, batch, 24, grab)
                kinds = {}
                for k, v in per.items():
                    key = k.split("_")[0] if not k.startswith(("attention", "reduce_qk")) else k
                    kinds[key] = kinds.get(key, 0.0) + float(np.median(v[4:]))
                print(f"PROFILE {shape} b{batch} {label}: " + ", ".join(f"{k} {v*1e3:.3f}" for k, v in sorted(kinds.items())) +
                      f"; total {sum(kinds.values())*1e3:.3f} ms", flush=True)
    backend.close() if hasattr(backend, "close") else None
    del backend
