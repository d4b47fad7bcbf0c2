"""Step times right after the backend is created, with the GPU's SM clock and P-state polled
alongside (nvidia-smi every 20 ms): do slow first steps follow the clock?"""
import subprocess, sys, threading, time
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
clocks, stop = [], False
def poll():
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,pstate,power.draw", "--format=csv,noheader", "-lms", "20"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        clocks.append((time.perf_counter(), line.strip()))
        if stop: p.kill(); break
threading.Thread(target=poll, daemon=True).start()
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
t0 = time.perf_counter()
for rep in range(3):
    engine, rows = prefilled_engine(backend, 1, 128, 100), []
    while engine.num_unfinished:
        s = time.perf_counter(); engine.step(); e = time.perf_counter()
        rows.append((s - t0, 1e3 * (e - s)))
    ms = np.array([r[1] for r in rows])
    print(f"rep {rep}: start {rows[0][0]:.3f} s, steps ms by tens:", " ".join(f"{ms[i:i+10].mean():.2f}" for i in range(0, len(ms), 10)), flush=True)
stop = True
time.sleep(0.1)
last = None
for t, c in clocks:
    if c != last:
        print(f"{t - t0:+.3f} {c}")
    last = c
