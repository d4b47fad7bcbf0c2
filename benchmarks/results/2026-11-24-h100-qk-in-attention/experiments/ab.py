"""Decode steps with attention making its heads (the decode recording) against the same steps
on the recording with qkv's reduce (every other step kind's): median step and logits bits.
usage: ab.py SHAPE BATCHES [gen]"""
import sys
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.backends.vulkan.graph import StepGraph
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

shape, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
gen = int(sys.argv[3]) if len(sys.argv) > 3 else 64
state = {"fused": True}
orig = StepGraph.command_buffer
StepGraph.command_buffer = lambda self, T, S: orig(self, T, S if state["fused"] else -1)
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
ref = {}
for rep in range(2):
    for fused in (False, True):
        state["fused"] = fused
        label = "qk in attention" if fused else "qkv reduce"
        for batch in batches:
            if rep == 0:
                hashes = logits_hashes(backend, batch)
                if batch not in ref:
                    ref[batch] = hashes
                verdict = "reference" if ref[batch] is hashes else ("IDENTICAL" if hashes == ref[batch] else "DIFFERENT")
                print(f"{shape} b{batch} {label}: logits {verdict}", flush=True)
            print(f"{shape} b{batch} {label}: {median_step(backend, batch, gen)*1e3:.3f} ms/step", flush=True)
