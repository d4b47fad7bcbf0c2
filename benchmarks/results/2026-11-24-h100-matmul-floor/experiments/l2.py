"""Matmul dispatch times with weights hot in L2 vs cold, chains of dispatches; queue families."""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parent))
from chain import Chains

ch = Chains()
dev, vk, mem, kern, meta, sink = ch.dev, ch.vk, ch.mem, ch.kern, ch.meta, ch.sink
for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(dev.physical)):
    print(f"queue family {i}: flags {q.queueFlags:#x} count {q.queueCount}", flush=True)
filled = ch.filled
xs = filled(32 * 2 * 10240 * 2, "x split")
part = mem.alloc(16 * 32 * 20480 * 4, "partial")
flushbuf = mem.alloc(1 << 30, "flush")
COPIES = 8
shapes = {  # name: (N cols, K, chunks, gated)
    "qkv": (4096, 2560, 8, False), "o": (2560, 2048, 8, False),
    "gateup": (20480, 2560, 2, True), "down": (2560, 10240, 16, False),
}
W = {}
for name, (N, K, chunks, gated) in shapes.items():
    per = (N // 2 if gated else N) * K * 2
    W[name] = [(filled(per, f"{name}{c}"), filled(per, f"{name}{c}u") if gated else None) for c in range(COPIES)]
lm = filled(262144 * 2560 * 2, "lm")

def dset(w, w2):
    return kern.descriptor_set({0: w, 1: xs, 2: part, 7: meta, **({4: w2} if w2 is not None else {})}, sink)

def flush(cb):  # a 1 GiB streaming read: the weights leave L2
    kern.record_direct(cb, "read_bandwidth", kern.descriptor_set({0: flushbuf, 1: sink}, sink),
                       {"n": flushbuf.size // 16, "iterations": 1}, 4096)

def run(M, items, flush_first=False, reps=5):
    return ch.run(M, items, reps, flush if flush_first else None)

def item(name, c, M):
    N, K, chunks, gated = shapes[name]
    m_groups = -(-M // 32)
    groups = m_groups * (N // 128) * chunks
    w, w2 = W[name][c]
    return ("coop_gated_t16" if gated else "coop_t16", dset(w, w2), {"N": N, "K": K, "kchunk": K // chunks, "group": 0}, groups)

for M in (1, 32):
    run(M, [item("gateup", c, M) for c in range(COPIES)] * 4, reps=3)  # warm the clocks
    for name, (N, K, chunks, gated) in shapes.items():
        mb = N * K * 2 / 1e6
        hot = run(M, [item(name, 0, M)] * 8)
        cold = run(M, [item(name, c, M) for c in range(COPIES)])
        single = run(M, [item(name, 0, M)], flush_first=True)
        print(f"M={M:2d} {name:6s} {mb:6.1f} MB: same weights chained {np.median(hot[1:]):6.1f} us "
              f"({mb/np.median(hot[1:]):5.2f} TB/s); distinct chained {np.median(cold[1:]):6.1f} us "
              f"({mb/np.median(cold[1:]):5.2f} TB/s); single after flush {single[0]:6.1f} us", flush=True)
    # a layer's chain: qkv, o, gateup, down on distinct copies, vs the same with every weight hot
    layer = [item(n, c, M) for c in range(COPIES) for n in ("qkv", "o", "gateup", "down")]
    t = run(M, layer)
    print(f"M={M:2d} layer chain, distinct weights: {t.sum()/COPIES:7.1f} us per layer; per kind " +
          ", ".join(f"{n} {np.median(t[i::4]):.1f}" for i, n in enumerate(("qkv", "o", "gateup", "down"))), flush=True)
    lmi = ("coop_rows_t16", kern.descriptor_set({0: lm, 1: xs, 2: part, 7: meta}, sink),
           {"N": 262144, "K": 2560, "kchunk": 2560, "group": 0}, -(-M // 32) * 2048)
    t = run(M, [lmi], flush_first=True)
    print(f"M={M:2d} lm head 1342 MB single after flush {t[0]:.1f} us ({1342.2/t[0]:.2f} TB/s)", flush=True)
