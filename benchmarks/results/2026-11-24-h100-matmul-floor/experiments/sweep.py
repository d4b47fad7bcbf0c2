"""Decode matmul variants (mm.comp builds) and K-chunk counts: GPU us per dispatch in a chain of
8 dispatches over distinct weight copies (cold: weights from HBM), 4b shapes, M = 1 and 32."""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import file_variant
from gemma_batch.backends.vulkan import kernels as Kmod
from chain import Chains

HERE = Path(__file__).resolve().parent
VARIANTS = [("base", 128, 4), ("bring1", 128, 4), ("bring2", 128, 4), ("bring3", 128, 4), ("bring2ks2", 128, 2), ("bring3ks8", 128, 8),
            ("bring3ks2", 128, 2), ("bring4ks2", 128, 2), ("base", 128, 4)]
if len(sys.argv) > 1:
    VARIANTS = [v for v in VARIANTS if v[0] in sys.argv[1].split(",")]
SHAPES = {"qkv": (4096, 2560, False, (4, 5, 8, 10)), "o": (2560, 2048, False, (4, 8, 16)),
          "gateup": (20480, 2560, True, (1, 2, 4, 5)), "down": (2560, 10240, False, (8, 10, 16, 20, 32))}
DEFAULT = {"qkv": 8, "o": 8, "gateup": 2, "down": 16}
ch = Chains()
mem, kern, meta, sink, run = ch.mem, ch.kern, ch.meta, ch.sink, ch.run
xs = ch.filled(32 * 2 * 10240 * 2, "x split")
part = mem.alloc(64 * 32 * 20480 * 4, "partial")
COPIES = 8
W = {n: [(ch.filled((N // 2 if g else N) * K * 2, n), ch.filled(N // 2 * K * 2, n) if g else None) for _ in range(COPIES)]
     for n, (N, K, g, _) in SHAPES.items()}

def item(name, c, M, chunks, BN):
    N, K, gated, _ = SHAPES[name]
    w, w2 = W[name][c]
    ds = kern.descriptor_set({0: w, 1: xs, 2: part, 7: meta, **({4: w2} if gated else {})}, sink)
    return ("coop_gated_t16" if gated else "coop_t16", ds, {"N": N, "K": K, "kchunk": K // chunks, "group": 0},
            -(-M // 32) * (N // BN) * chunks)

first = True
reference = {}
for label, BN, KS in VARIANTS:
    for kind, g in (("coop_t16", "plain"), ("coop_gated_t16", "gated")):
        Kmod.VARIANTS[kind] = file_variant(kind, "matmul_coop_direct", HERE / f"{label}_{g}.spv")
        kern.pipelines.pop(kind, None)
    same = []
    for M in (1, 32):  # the partial sums, against the first variant's (rows < M of every chunk)
        for name, (N, K, gated, _) in SHAPES.items():
            chunks = DEFAULT[name]
            if (K // chunks) % (16 * KS):
                continue
            run(M, [item(name, 0, M, chunks, BN)], reps=1)
            got = mem.download(part, chunks * 32 * N * 4).view(np.float32).reshape(chunks, 32, N)[:, :M]
            same.append(np.array_equal(reference.setdefault((M, name), got.copy()), got))
    print(f"{label}: partial sums {'IDENTICAL' if all(same) else 'DIFFERENT ' + str(same)} to {VARIANTS[0][0]}'s", flush=True)
    for M in (1, 32):
        import time
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.6:  # clocks up, before every variant
            run(M, [item("gateup", c, M, 2, BN) for c in range(COPIES)] * 6, reps=3)
        line = []
        for name, (N, K, gated, chunk_list) in SHAPES.items():
            for chunks in chunk_list:
                if (K // chunks) % (16 * KS):
                    continue
                t = run(M, [item(name, c, M, chunks, BN) for c in range(COPIES)])
                line.append(f"{name}/{chunks} {np.median(t[1:]):.1f}")
        layer = [item(n, c, M, DEFAULT[n], BN) for c in range(COPIES) for n in ("qkv", "o", "gateup", "down")
                 if (SHAPES[n][1] // DEFAULT[n]) % (16 * KS) == 0]
        t = run(M, layer)
        print(f"{label:8s} M={M:2d}: layer {t.sum() / COPIES:6.1f} us ({len(layer) // COPIES} kinds) | " + ", ".join(line), flush=True)
