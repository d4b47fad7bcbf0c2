"""Time of the direct decode matmul against its workgroup count, at fixed work per workgroup."""
import sys
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-matmul-floor/experiments")  # chain.py
from chain import Chains

ch = Chains()
KMAX, NMAX, COPIES = 1280, 1056 * 128, 3
W = [ch.filled(NMAX * KMAX * 2, f"w{c}") for c in range(COPIES)]
xs = ch.filled(32 * 2 * KMAX * 2 * 8, "x")
part = ch.mem.alloc(32 * NMAX * 4 * 2, "part")

def item(c, N, K, chunks=1, gated=False):
    ds = ch.kern.descriptor_set({0: W[c], 1: xs, 2: part, 7: ch.meta, **({4: W[(c + 1) % COPIES]} if gated else {})}, ch.sink)
    return ("coop_gated_t16" if gated else "coop_t16", ds, {"N": N, "K": K, "kchunk": K // chunks, "group": 0},
            (N // 128) * chunks)

def timed(M, N, K, chunks=1, gated=False, n=9):
    t = ch.run(M, [item(i % COPIES, N, K, chunks, gated) for i in range(n)], reps=5)
    return float(np.median(t[1:]))

for _ in range(3):
    timed(1, NMAX, KMAX)  # clocks up
for K in (1280, 640):
    for M in (1, 32):
        print(f"K per workgroup {K}, M={M}: per-workgroup weight bytes {128*K*2/1e3:.0f} KB", flush=True)
        for groups in (66, 132, 198, 264, 300, 320, 330, 364, 396, 430, 462, 528, 594, 660, 792, 924, 1056):
            timed(M, NMAX, KMAX)
            us = timed(M, groups * 128, K)
            mb = groups * 128 * K * 2 / 1e6
            print(f"  {groups:5d} groups ({groups/132:4.2f} per SM): {us:7.2f} us  {mb/us:5.2f} TB/s", flush=True)
# the shipped gate/up and down shapes, and the same bytes cut to 264 / 396 workgroups
print("gate/up shipped (320 groups, gated, 2 chunks):", round(timed(1, 20480, 2560, 2, True), 2), flush=True)
print("down-like (N 2560, K 10240 as 16 chunks) not runnable here (K max 1280)", flush=True)
