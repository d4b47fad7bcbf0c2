"""How fast can any kernel read N MB once? read_bandwidth.comp over buffers of the 4b matrices'
sizes, one pass, chained over distinct buffers (cold), for several grid sizes."""
import sys
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-matmul-floor/experiments")  # chain.py
from chain import Chains

ch = Chains()
COPIES = 6
sizes = {"o 10.5 MB": 10485760, "qkv 21 MB": 20971520, "down 52 MB": 52428800, "gate/up 105 MB": 104857600}
bufs = {k: [ch.mem.alloc(n, k) for _ in range(COPIES)] for k, n in sizes.items()}
big = ch.mem.alloc(1 << 30, "1 GiB")
sink = ch.mem.alloc(4 * 8192 * 256, "sink")

def item(buf, n, groups):
    return ("read_bandwidth", ch.kern.descriptor_set({0: buf, 1: sink}, sink), {"n": n // 16, "iterations": 1}, groups)

for _ in range(3):
    ch.run(1, [item(big, 1 << 30, 4096)] * 2, reps=3)
t = ch.run(1, [item(big, 1 << 30, 4096)] * 4, reps=3)
print(f"1 GiB one pass, 4096 groups: {np.median(t[1:]):.1f} us = {(1 << 30) / np.median(t[1:]) / 1e6:.2f} TB/s", flush=True)
for groups in (264, 396, 528, 1056, 2112, 4096, 8192):
    ch.run(1, [item(big, 1 << 30, 4096)] * 2, reps=2)
    line = []
    for k, n in sizes.items():
        t = ch.run(1, [item(b, n, groups) for b in bufs[k]] * 2, reps=5)
        us = float(np.median(t[1:]))
        line.append(f"{k}: {us:6.1f} us {n / us / 1e6:4.2f} TB/s")
    print(f"{groups:5d} groups x 256: " + " | ".join(line), flush=True)
