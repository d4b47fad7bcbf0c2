"""Grid-stride decode matmul (each workgroup loops over tiles) against the shipped one-tile-a-workgroup
grid: the 4b LM head (1.34 GB) single after a 1 GiB flush, and gate/up chained, at M = 1 and 32;
partial sums compared bit for bit."""
import hashlib, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
from chain import Chains
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan.variants import Variant

HERE = Path(__file__).resolve().parent
for name, f in (("gs_rows", "gs_rows.spv"), ("gs_plain", "gs_plain.spv"), ("gs_gated", "gs_gated.spv")):
    class V(Variant):
        @property
        def spv(self, p=HERE / f):
            return p
    Kmod.VARIANTS[name] = V(name, "matmul_coop_direct")
ch = Chains()
mem, kern, sink = ch.mem, ch.kern, ch.sink
N, K = 262208, 2560
xs = ch.filled(32 * 2 * 10240 * 2, "x split")
part = mem.alloc(32 * N * 4 * 2, "partial")
flushbuf = mem.alloc(1 << 30, "flush")
lm = ch.filled(N * K * 2, "lm")
gate = [ch.filled(10240 * 2560 * 2, f"g{i}") for i in range(4)]
up = [ch.filled(10240 * 2560 * 2, f"u{i}") for i in range(4)]

def flush(cb):
    kern.record_direct(cb, "read_bandwidth", kern.descriptor_set({0: flushbuf, 1: sink}, sink),
                       {"n": flushbuf.size // 16, "iterations": 1}, 4096)

def lm_item(name, groups):
    return (name, kern.descriptor_set({0: lm, 1: xs, 2: part, 7: ch.meta}, sink), {"N": N, "K": K, "kchunk": K, "group": 0}, groups)

def gu_item(name, i, groups):
    return (name, kern.descriptor_set({0: gate[i], 4: up[i], 1: xs, 2: part, 7: ch.meta}, sink),
            {"N": 20480, "K": 2560, "kchunk": 1280, "group": 0}, groups)

def h(M):
    return hashlib.sha1(mem.download(part, 16 * N * 4).tobytes()).hexdigest()[:10]

for _ in range(3):  # warm the clocks
    ch.run(1, [lm_item("coop_rows_t16", 2049)] * 4, 3)
full = -(-N // 128)
for M in (1, 32):
    ch.run(M, [lm_item("coop_rows_t16", full)], 1)
    ref = h(M)
    for rnd in range(2):
        t = ch.run(M, [lm_item("coop_rows_t16", full)], 5, flush)
        print(f"M={M} round {rnd} shipped {full} workgroups: LM head {t[0]:.1f} us", flush=True)
        for g in (264, 396, 528, 792, 1056):
            t = ch.run(M, [lm_item("gs_rows", g)], 5, flush)
            print(f"M={M} round {rnd} grid-stride {g}: LM head {t[0]:.1f} us  bits {'same' if h(M) == ref else 'DIFFERENT'}", flush=True)
    gfull = 160 * 2
    t = ch.run(M, [gu_item("coop_gated_t16", i, gfull) for i in range(4)] * 2, 5)
    print(f"M={M} gate/up chained, shipped {gfull}: {np.median(t[1:]):.1f} us", flush=True)
    for g in (264, 396):
        t = ch.run(M, [gu_item("gs_gated", i, g) for i in range(4)] * 2, 5)
        print(f"M={M} gate/up chained, grid-stride {g}: {np.median(t[1:]):.1f} us", flush=True)
