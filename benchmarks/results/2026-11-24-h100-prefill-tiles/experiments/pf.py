"""Prefill tiles of matmul_coop.comp (fp16 weight tiles, split inputs): GPU time of the 4b layer's
four matmuls at M = 4096 and 16384 rows, partial sums checked bit for bit against the shipped tile."""
import hashlib, os, sys, time
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import kernels as Kmod, pipeline_stats
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.timestamps import Timestamps
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # benchmarks/
from kernel_stats import hopper_resident  # noqa: E402

TILES = {  # label: (BN, BM)
    "base": (64, 128), "k32": (64, 128), "n128a": (128, 128), "n128b": (128, 128), "n128c": (128, 128),
    "n128m64": (128, 64), "n128m64b": (128, 64), "n256m64": (256, 64), "wide": (128, 128), "i8base": (64, 128),
}
labels = sys.argv[1].split(",") if len(sys.argv) > 1 else list(TILES)
for l in labels:
    TILES.setdefault(l, TILES[l.split("_g")[0]])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
dev = Device(capture_statistics=True)
vk, mem = dev.vk, Memory(dev)
X_LO = os.environ.get("X_LO", "1") == "1"
I8 = os.environ.get("WDT", "T16") == "I8"
kern = Kernels(dev, x_lo=X_LO, kv_group=2, hidden=2560)
stamps = Timestamps(dev, 64)
junk = (np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32) * 0.05).astype(np.float16)

def filled(nbytes, label, seed):
    b = mem.alloc(nbytes, label)
    j = np.roll(junk, seed * 7919)
    for off in range(0, nbytes, j.nbytes):
        mem.upload(b, j.view(np.uint8)[:min(j.nbytes, nbytes - off)], off)
    return b

import os
MAXM = int(os.environ.get("MAXM", 16384))
shapes = {"qkv": (4096, 2560, 8, False), "o": (2560, 2048, 8, False), "gateup": (20480, 2560, 2, True), "down": (2560, 10240, 16, False)}
xs = filled(MAXM * 2 * 10240 * 2, "x split", 1)
part = mem.alloc(MAXM * 20480 * 4, "partial")
meta = mem.alloc_host(16, "meta")
sink = mem.alloc(1 << 20, "sink")
WB = (lambda n, k: n * k + 4 * n) if I8 else (lambda n, k: 2 * n * k)
W = {n: (filled(WB(N // 2 if g else N, K), n, 2 + i), filled(WB(N // 2, K), n + "u", 9 + i) if g else None)
     for i, (n, (N, K, c, g)) in enumerate(shapes.items())}

for label in labels:
    for g in ("plain", "gated"):
        name = f"pf_{label}_{g}"
        class V(Variant):
            @property
            def spv(self, p=HERE / "spv" / f"{label}_{g}.spv"):
                return p
        Kmod.VARIANTS[name] = V(name, "matmul_coop")
        st = pipeline_stats.statistics(kern, name)
        inv = pipeline_stats.workgroup_size(Kmod.VARIANTS[name].spv.read_bytes())
        r, s = st.get("Register Count"), st.get("Shared Memory Size")
        print(f"{name}: {inv} invocations, {r} registers, {s} B shared, {hopper_resident(int(r), int(s), inv)} a SM", flush=True)

def items(label, M):
    BN, BM = TILES[label]
    out = []
    for n, (N, K, chunks, gated) in shapes.items():
        w, u = W[n]
        ds = kern.descriptor_set({0: w, 1: xs, 2: part, 7: meta, **({4: u} if u is not None else {})}, sink)
        out.append((f"pf_{label}_{'gated' if gated else 'plain'}", ds, {"N": N, "K": K, "kchunk": K // chunks, "group": 0},
                    -(-M // BM) * (N // BN), n))
    return out

def run(M, its, reps, clear=False):
    meta.array[:16] = np.array([M, M, M, 0], np.uint32).view(np.uint8)
    cb = dev.command_buffer()
    vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
    if clear:  # a NaN pattern, so that outputs a build leaves unwritten cannot match
        vk.vkCmdFillBuffer(cb, part.handle, 0, part.size, 0x7fc00001)
        b = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                               dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [b], 0, None, 0, None)
    stamps.reset(cb)
    stamps.write(cb, 0)
    for i, (name, ds, push, groups, _) in enumerate(its):
        kern.record_direct(cb, name, ds, push, groups)
        stamps.write(cb, i + 1)
    vk.vkEndCommandBuffer(cb)
    out = []
    for _ in range(reps):
        dev.submit_and_wait(cb)
        out.append(stamps.seconds(len(its) + 1))
    vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
    return np.median(np.array(out), axis=0) * 1e3

def hashes(label, M):
    out = []
    for it in items(label, M):
        run(M, [it], 1, clear=True)
        N = shapes[it[4]][0]
        out.append(hashlib.sha1(mem.download(part, M * N * 4).tobytes()).hexdigest()[:10])
    return out

t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.5:  # warm the clocks
    run(4096, items(labels[0], 4096) * 2, 1)
ref = hashes(labels[0], 4096)
print("base hashes at 4096 rows:", ref, flush=True)
for label in labels:
    h = hashes(label, 4096)
    print(f"{label}: {'identical' if h == ref else 'DIFFERENT ' + str(h)}", flush=True)
for rnd in range(rounds):
    for M in (4096, MAXM):
        for label in labels:
            its = items(label, M)
            run(M, its, 1)
            t = run(M, its * 2, 3)
            t = np.minimum(t[:4], t[4:])
            flop = sum(2 * M * shapes[n][0] * shapes[n][1] * (2 if X_LO else 1) for n in shapes)  # hi and lo
            print(f"round {rnd} M={M:5d} {label:9s} layer {t.sum():7.3f} ms  " + " ".join(f"{n} {x:6.3f}" for n, x in zip(shapes, t))
                  + f"  {flop / t.sum() / 1e9:6.1f} TFLOP/s executed", flush=True)
    kern.reset_sets()
