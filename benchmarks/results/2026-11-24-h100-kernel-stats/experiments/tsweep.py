"""TM=1 / ring variants of the decode matmul: registers (pipeline statistics) and GPU us per
dispatch in chains over distinct weight copies, 4b shapes, M = 1 (and 16 for TM=1 builds)."""
import sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # stats_hook.py
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-matmul-floor/experiments")  # chain.py
import stats_hook  # noqa: F401  (capture statistics: must come before the device)
from common import file_variant
from gemma_batch.backends.vulkan import kernels as Kmod
from chain import Chains

HERE = Path(__file__).resolve().parent
LABELS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "tm1", "tm1r2", "tm1r3", "tm1r2i", "r2", "tm1ks8", "tm1r2ks2", "tm1r4ks2", "base"]
KS = {"tm1ks8": 8, "tm1r2ks2": 2, "tm1r4ks2": 2}
SHAPES = {"qkv": (4096, 2560, False, (8, 10)), "o": (2560, 2048, False, (8, 16)),
          "gateup": (20480, 2560, True, (2, 4)), "down": (2560, 10240, False, (16, 20))}
DEFAULT = {"qkv": 8, "o": 8, "gateup": 2, "down": 16}
ch = Chains()
kern, mem = ch.kern, ch.mem
COPIES = 6
W = {n: [(ch.filled((N // 2 if g else N) * K * 2, n), ch.filled(N // 2 * K * 2, n) if g else None) for _ in range(COPIES)]
     for n, (N, K, g, _) in SHAPES.items()}
xs = ch.filled(32 * 2 * 10240 * 2, "x split")
part = mem.alloc(32 * 32 * 20480 * 4, "partial")

def item(name, c, M, chunks):
    N, K, gated, _ = SHAPES[name]
    w, w2 = W[name][c]
    ds = kern.descriptor_set({0: w, 1: xs, 2: part, 7: ch.meta, **({4: w2} if gated else {})}, ch.sink)
    return ("coop_gated_t16" if gated else "coop_t16", ds, {"N": N, "K": K, "kchunk": K // chunks, "group": 0},
            -(-M // 32) * (N // 128) * chunks)

reference = {}
for label in LABELS:
    ks = KS.get(label, 4)
    regs = []
    for kind, g in (("coop_t16", "plain"), ("coop_gated_t16", "gated")):
        Kmod.VARIANTS[kind] = file_variant(kind, "matmul_coop_direct", HERE / f"{label}_{g}.spv")
        kern.pipelines.pop(kind, None)
        regs.append(stats_hook.stats(kern, kind))
    same = []
    Ms = (1, 16) if label.startswith("tm1") else (1, 16, 32)
    for M in Ms:
        for name, (N, K, gated, _) in SHAPES.items():
            chunks = DEFAULT[name]
            ch.run(M, [item(name, 0, M, chunks)], reps=1)
            got = mem.download(part, chunks * 32 * N * 4).view(np.float32).reshape(chunks, 32, N)[:, :M]
            same.append(np.array_equal(reference.setdefault((M, name), got.copy()), got))
    if label == LABELS[0]:
        try:
            print("internal representations:", stats_hook.internal(kern, "coop_t16"), flush=True)
        except Exception as e:  # noqa: BLE001
            print("internal representations:", type(e).__name__, e, flush=True)
    if label in ("wonly", "plainld", "tm1wonly"):
        same = []
    print(f"{label}: {regs[0]} | gated {regs[1]} | partial sums {'IDENTICAL' if all(same) else 'DIFFERENT ' + str(same)}", flush=True)
    for M in Ms:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.6:
            ch.run(M, [item("gateup", c, M, 2) for c in range(COPIES)] * 6, reps=3)
        line = []
        for name, (N, K, gated, chunk_list) in SHAPES.items():
            for chunks in chunk_list:
                if (K // chunks) % (16 * ks):
                    continue
                t = ch.run(M, [item(name, c, M, chunks) for c in range(COPIES)])
                line.append(f"{name}/{chunks} {np.median(t[1:]):.1f}")
        layer = [item(n, c, M, DEFAULT[n]) for c in range(COPIES) for n in ("qkv", "o", "gateup", "down")]
        t = ch.run(M, layer)
        print(f"  {label:8s} M={M:2d}: layer {t.sum() / COPIES:6.1f} us | " + ", ".join(line), flush=True)
