"""Experiment: each 4b matrix read once (read_floor.py's chains, over 4 copies), in grid-stride
and per-workgroup block patterns, by workgroups of 128 and 256 invocations, at the decode
matmul's grids and at fixed ones.

    python3 benchmarks/results/2026-11-24-h100-persistent/experiments/pattern.py 4b

Builds pattern.comp's variants into spv/ here where glslc is installed (carry it to the GPU
machine, which has none)."""
import shutil, subprocess, sys, time
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))
from read_floor import matrices, Reads, WARM_READS
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.bandwidth import GROUPS

HERE = Path(__file__).resolve().parent
SPV = HERE / "spv"  # built here by glslc where it is installed (the GPU machine has none: carry them)
BUILDS = {"stride256": [], "stride128": ["-DWG=128"], "block128": ["-DWG=128", "-DBLOCK"], "block256": ["-DBLOCK"]}
MATMUL_GRID = {"qkv": 256, "o": 160, "gate/up": 320, "down": 320}  # the shipped decode matmul's workgroups


def use(name):
    path = SPV / f"{name}.spv"
    class V(Variant):
        @property
        def spv(self):
            return path
    Kmod.VARIANTS["read_bandwidth"] = V("read_bandwidth", "read_bandwidth")


def main():
    for name, d in BUILDS.items():
        if shutil.which("glslc"):
            SPV.mkdir(exist_ok=True)
            subprocess.run(["glslc", "-fshader-stage=compute", "--target-env=vulkan1.2", "-O", *d, str(HERE / "pattern.comp"),
                        "-o", str(SPV / f"{name}.spv")], check=True)
    layers, sizes = matrices(sys.argv[1] if len(sys.argv) > 1 else "4b")
    sizes.pop("lm head")
    dev = Device()
    small = "llvmpipe" in dev.info.name
    if small:
        sizes = {k: v // 4096 // 16 * 16 for k, v in sizes.items()}
    print(dev.info.name, flush=True)
    results = {}
    for name in BUILDS:
        use(name)
        reads = Reads(dev)
        warm = min(1 << 30, dev.info.max_storage_buffer_range) // 16 * 16
        big = reads.mem.alloc(warm, "warm")
        chains = {k: ([reads.mem.alloc(n, k) for _ in range(4)], n) for k, n in sizes.items()}
        start = time.perf_counter()
        while time.perf_counter() - start < (0 if small else 0.6):
            reads.chains_us((big, warm), {}, GROUPS, repeats=1)
        grids = [("matmul", None), ("264", 264), ("396", 396), ("528", 528), ("1056", 1056)]
        for gname, g in grids:
            row = {}
            for k in sizes:
                gg = MATMUL_GRID[k] if g is None else g
                row[k] = reads.chains_us((big, warm), {k: chains[k]}, gg)[k]
            print(f"{name:10s} grid {gname:7s}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items())
                  + f" | layer {sum(row.values()):.1f} us", flush=True)
        for bufs, _ in chains.values():
            for b in bufs:
                reads.mem.free(b)
        reads.mem.free(big)
        dev_kern = reads.kern
        dev_kern.pipelines.clear()


if __name__ == "__main__":
    main()
