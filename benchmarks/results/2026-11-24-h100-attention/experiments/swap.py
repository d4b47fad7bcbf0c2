"""Swap shipped kernels for experimental SPIR-V builds: the median 4b decode step per build, and
a bit-for-bit check (a hash of every decode step's logits) against the first build.
usage: swap.py SHAPE BATCHES 'label:name=file.spv,name=file.spv;label2:...' [gen]"""
import hashlib, sys
from pathlib import Path
from common import median_step, parse_builds, use_build
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent

shape, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
builds = parse_builds(sys.argv[3])
gen = int(sys.argv[4]) if len(sys.argv) > 4 else 48
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))

ref = {}
for rep in range(2):
    for label, swaps in builds:
        use_build(backend, builds, swaps, HERE)
        for batch in batches:
            if rep == 0:  # bits: hash of the logits after each of 6 decode steps
                engine = prefilled_engine(backend, batch, 128, 7)
                hashes = []
                while engine.num_unfinished:
                    engine.step()
                    hashes.append(hashlib.sha1(backend.mem.download(backend.buffers.logits).tobytes()).hexdigest()[:12])
                key = batch
                if key not in ref:
                    ref[key] = hashes
                verdict = "reference" if ref[key] is hashes else ("IDENTICAL" if hashes == ref[key] else "DIFFERENT")
                print(f"{shape} b{batch} {label}: logits {verdict}", flush=True)
            print(f"{shape} b{batch} {label}: {median_step(backend, batch, gen)*1e3:.3f} ms/step", flush=True)
