"""Experiment: a 4b decode step's weight reads plus latency-bound small phases, one dispatch per
phase (barriers) against persistent dispatches with grid-wide barriers (persist.comp).

    python3 benchmarks/results/2026-11-24-h100-persistent/experiments/persist.py 4b DEPTH

DEPTH: the dependent loads of each small phase. Where glslc is installed it first builds
persist.comp's variants into spv/ here (ignored by git); the GPU machine has no glslc, so run it
once here and carry that folder. On llvmpipe only the dispatch mode runs (its workgroups do not all run
at once, so a grid-wide barrier would wait for ever), on buffers 4096 times smaller."""
import shutil, subprocess, sys, time
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))
from read_floor import matrices, LAYER
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.backends.vulkan.bandwidth import GROUPS, measure_read_bandwidth
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.timestamps import Timestamps

HERE = Path(__file__).resolve().parent
BUILDS = {"pf0": ["-DPF=0"], "pf8": ["-DPF=8"], "pf16": ["-DPF=16"], "pf8f": ["-DPF=8", "-DFORCE"],
          "pf4f": ["-DPF=4", "-DFORCE"], "pf16f": ["-DPF=16", "-DFORCE"]}
SPV = HERE / "spv"  # built here by glslc where it is installed (the GPU machine has none: carry them)
COPIES = 4
SMALL = [5, 12, 5, 20]  # workgroups of the small phase before qkv, o, gate/up, down (batch 1)
DEPTH = int(sys.argv[2]) if len(sys.argv) > 2 else 4


def variant(name, spv):
    class V(Variant):
        @property
        def spv(self):
            return SPV / spv
    Kmod.VARIANTS[name] = V(name, "read_bandwidth")


def main():
    shape = sys.argv[1] if len(sys.argv) > 1 else "4b"
    layers, sizes = matrices(shape)
    for name, defines in BUILDS.items():
        if shutil.which("glslc"):
            SPV.mkdir(exist_ok=True)
            subprocess.run(["glslc", "-fshader-stage=compute", "--target-env=vulkan1.2", "-O", *defines,
                        str(HERE / "persist.comp"), "-o", str(SPV / f"{name}.spv")], check=True)
        variant(f"persist_{name}", f"{name}.spv")
    dev = Device()
    kern, mem = Kernels(dev), Memory(dev)
    vk = dev.vk
    bw = measure_read_bandwidth(kern, mem, 1 << 30)
    print(f"{dev.info.name}; {shape}, {layers} layers; bandwidth {bw / 1e9:.1f} GB/s; small phases {SMALL} depth {DEPTH}", flush=True)
    if "llvmpipe" in dev.info.name:  # a smoke test of the dispatch mode only: no concurrent workgroups
        sizes = {k: v // 256 // 16 * 16 for k, v in sizes.items()}
    layer_bytes = sum(sizes[k] for k in LAYER)
    data = mem.alloc(COPIES * layer_bytes, "layers")
    head = mem.alloc(sizes["lm head"], "lm head")
    WARM = min(1 << 30, dev.info.max_storage_buffer_range) // 16 * 16
    warm = mem.alloc(WARM, "warm")
    sink = mem.alloc(4 * 8192 * 256, "sink")
    scratch = mem.alloc(16 * 65536, "scratch")

    def phases(kind):
        out = []  # (kind | buf << 8, offset words, count, groups)
        for l in range(layers):
            base = (l % COPIES) * layer_bytes
            for (name, _), small in zip(LAYER.items(), SMALL):
                if kind == "full":
                    out.append((1, 0, DEPTH, small))
                out.append((0, base // 16, sizes[name] // 16, 0))
                base += sizes[name]
        out.append((0 | 1 << 8, 0, sizes["lm head"] // 16, 0))
        return out

    table = {k: phases(k) for k in ("reads", "full")}
    ptab = {k: mem.alloc(16 * len(v), f"phases {k}") for k, v in table.items()}
    for k, v in table.items():
        mem.upload(ptab[k], np.array(v, np.uint32))
    nsync = 8 + 2 * max(len(v) for v in table.values())
    sync = mem.alloc(4 * nsync, "sync")
    dsets = {k: kern.descriptor_set({0: data, 5: head, 1: sync, 2: ptab[k], 3: scratch, 4: sink}, sink) for k in table}
    wset = kern.descriptor_set({0: warm, 1: sink}, sink)

    def record(cb, mode, kind, groups, pf):
        ph = table[kind]
        name = f"persist_{pf}"
        if mode == "dispatch":
            for i, p in enumerate(ph):
                kern.record_direct(cb, name, dsets[kind], {"n": i, "iterations": 1}, groups if p[0] & 255 == 0 else p[3])
        elif mode == "layer":
            per = (len(ph) - 1) // layers  # a layer's phases; the LM head's read last
            for l in range(layers):
                kern.record_direct(cb, name, dsets[kind], {"n": l * per, "iterations": per}, groups)
            kern.record_direct(cb, name, dsets[kind], {"n": len(ph) - 1, "iterations": 1}, groups)
        else:  # whole step
            kern.record_direct(cb, name, dsets[kind], {"n": 0, "iterations": len(ph)}, groups)

    def timed(mode, kind, groups, pf, reps=3, submits=3):
        stamps = Timestamps(dev, 2 * reps)
        cb = dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        for _ in range(4):
            kern.record_direct(cb, "read_bandwidth", wset, {"n": WARM // 16, "iterations": 1}, GROUPS)
        for r in range(reps):
            vk.vkCmdFillBuffer(cb, sync.handle, 0, 4 * nsync, 0)
            barrier = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                         dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
            vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, [barrier], 0, None, 0, None)
            kern.record_direct(cb, "read_bandwidth", wset, {"n": WARM // 64, "iterations": 1}, GROUPS)  # keep busy
            stamps.write(cb, 2 * r)
            record(cb, mode, kind, groups, pf)
            stamps.write(cb, 2 * r + 1)
        vk.vkEndCommandBuffer(cb)
        out = []
        for _ in range(submits):
            dev.submit_and_wait(cb)
            s = stamps.seconds(2 * reps)
            out += list(s[0::2])
        gave_up = int(mem.download(sync, 8).view(np.uint32)[1])
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])
        stamps.free()
        return float(np.median(out)) * 1e3, float(np.min(out)) * 1e3, gave_up

    weights = layers * layer_bytes + sizes["lm head"]
    start = time.perf_counter()
    while time.perf_counter() - start < (1.0 if "llvmpipe" not in dev.info.name else 0):
        timed("dispatch", "reads", 528, "pf0", reps=1, submits=1)
    rows = []
    modes = (("dispatch", ("pf0",)), ("layer", ("pf0", "pf8", "pf8f")), ("step", ("pf0", "pf8", "pf8f", "pf4f", "pf16", "pf16f")))
    if "llvmpipe" in dev.info.name:
        modes = modes[:1]
    for kind in ("reads", "full"):
        for groups in (396, 528):
            for mode, pfs in modes:
                for pf in pfs:
                    if groups == 528 and pf.startswith("pf16"):
                        continue  # not 4 a SM: the grid barrier would wait for workgroups not yet running
                    med, best, gave = timed(mode, kind, groups, pf)
                    print(f"{kind:5s} {mode:8s} groups {groups:4d} PF {pf:4s}: median {med:.3f} ms, best {best:.3f} "
                          f"({weights / (med * 1e-3) / bw:.1%} of roofline){'  GAVE UP ' + str(gave) if gave else ''}", flush=True)


if __name__ == "__main__":
    main()
