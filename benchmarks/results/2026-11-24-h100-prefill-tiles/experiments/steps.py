"""Per-step wall and device times of bench cases (4b, 128 + 128; batch 1 then 32, twice each),
with Python's garbage collections logged: where do the slow decode steps come from?"""
import gc, sys, time
import numpy as np
from gemma_batch.backends import create_backend
from gemma_batch.bench import runner
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config
from gemma_batch.model.quant import WeightFormat

collections = []  # (start perf_counter, generation, seconds)
_t = {}
def cb(phase, info):
    if phase == "start":
        _t["s"] = time.perf_counter()
    else:
        collections.append((_t["s"], info["generation"], time.perf_counter() - _t["s"]))
gc.callbacks.append(cb)

cfg = shape_config("4b")
backend = create_backend("vulkan", cfg, None, "fp16", "bf16")
backend.load_weights(random_tensors(cfg, 0, WeightFormat.parse("bf16")))
for batch in (1, 32, 32, 1):
    collections.clear()
    t0 = time.perf_counter()
    run = runner.run_case(backend, batch, 128, 128)
    started = time.perf_counter() - run.steps[-1].end_s  # the timed run's start (its last step ended just now)
    dec = [s for s in run.steps if s.prefill_tokens == 0]
    wall = np.array([s.wall_s for s in dec]) * 1e3
    dev = np.array([s.device_s or 0 for s in dec]) * 1e3
    med = np.median(wall)
    print(f"batch {batch}: {len(dec)} decode steps, wall median {med:.3f} mean {wall.mean():.3f} ms; device median {np.median(dev):.3f} mean {dev.mean():.3f}")
    slow = [(i, w, d) for i, (w, d) in enumerate(zip(wall, dev)) if w > med * 1.15]
    print("  slow steps (index, wall ms, device ms):", [(i, round(w, 2), round(d, 2)) for i, w, d in slow])
    timed = [(round((s - started) * 1e3, 1), g, round(d * 1e3, 2)) for s, g, d in collections if s >= started]
    print(f"  gc collections in the timed run (ms after its start, generation, ms): {timed}")
    print(f"  collections in the warm-up: {sum(1 for s, _, _ in collections if s < started)}")
    ends = np.array([s.end_s for s in dec]) * 1e3
    print("  slow steps end at (ms after the start):", [round(float(ends[i]), 1) for i, _, _ in slow])
