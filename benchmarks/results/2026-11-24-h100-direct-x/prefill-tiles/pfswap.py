"""Swap the fp16-tile prefill tile for experimental builds: GPU time of one whole-prompt prefill
step per build (median of 3, two rounds), and a bit-for-bit check of its logits against the first build.
usage: pfswap.py SHAPE 'label:name=file.spv,...;label2:...' [BATCHxPROMPT,...]"""
import hashlib, sys
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config
from common import parse_builds, use_build  # ../../2026-11-24-h100-attention/experiments/common.py, copied beside this file

HERE = Path(__file__).resolve().parent

shape = sys.argv[1]
builds = parse_builds(sys.argv[2])
cases = [tuple(int(v) for v in c.split("x")) for c in (sys.argv[3] if len(sys.argv) > 3 else "32x128,32x512").split(",")]
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))

for _ in range(3):  # warm the clocks
    prefilled_engine(backend, *cases[0], 2)
ref = {}
for rnd in range(2):
    for label, swaps in builds:
        use_build(backend, builds, swaps, HERE)
        for b, p in cases:
            secs, hashes = [], set()
            for _ in range(3):
                prefilled_engine(backend, b, p, 2)
                secs.append(backend.last_step_device_seconds())
                rows = backend.mem.download(backend.buffers.logits).view(np.float32)[:b * cfg.vocab_size]  # [R, V]: the step's rows
                hashes.add(hashlib.sha1(rows.tobytes()).hexdigest()[:12])
            h = hashes.pop() if len(hashes) == 1 else "VARIES"
            ref.setdefault((b, p), h)
            verdict = "reference" if rnd == 0 and label == builds[0][0] else ("IDENTICAL" if h == ref[(b, p)] else "DIFFERENT")
            ms = 1e3 * float(np.median(secs))
            print(f"{shape} {b}x{p} {label}: prefill {ms:.1f} GPU ms ({b*p/ms*1e3:,.0f} tok/s), logits {verdict}", flush=True)
