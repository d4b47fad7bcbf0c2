"""Time cm2_build.py's workgroup-scope GEMMs against benchmarks/gemm_coop.comp (the prefill
yardstick) on the 4b layer's GEMMs; each build first checked against numpy.

    python cm2_run.py --props                  # the device's VK_NV_cooperative_matrix2 features
    python cm2_run.py cm2_256_128x128x32.spv   # one build (one process each: a bad one may lose the device)
    python cm2_run.py ../../../gemm_coop.spv   # the yardstick, same script
"""
import argparse
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import vulkan as vk  # noqa: E402

from gemm_coop import register, run_gemm  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

EXT = "VK_NV_cooperative_matrix2"
FEATURES, FLEX, PROPS = 1000593000, 1000593001, 1000593002
FEATURE_NAMES = ("workgroupScope", "flexibleDimensions", "reductions", "conversions", "perElementOperations",
                 "tensorAddressing", "blockLoads")
KEEP = []


def raw_struct(stype: int, words: int, pnext=None):
    raw = vk.ffi.new(f"uint32_t[{words}]")
    base = vk.ffi.cast("VkBaseOutStructure*", raw)
    base.sType = stype
    base.pNext = vk.ffi.cast("VkBaseOutStructure*", pnext) if pnext is not None else vk.ffi.NULL
    return raw


def patch_create_device() -> None:
    """vkCreateDevice also enables VK_NV_cooperative_matrix2 with workgroup scope and flexible sizes."""
    original = vk.vkCreateDevice

    def create(physical, info, allocator, pDevice=None):
        names = [vk.ffi.string(info.ppEnabledExtensionNames[i]).decode() for i in range(info.enabledExtensionCount)] + [EXT]
        cnames = [vk.ffi.new("char[]", n.encode()) for n in names]
        arr = vk.ffi.new("char*[]", cnames)
        feats = raw_struct(FEATURES, 12, info.pNext)
        feats[4] = feats[5] = 1
        KEEP.extend([cnames, arr, feats])
        info.pNext, info.enabledExtensionCount, info.ppEnabledExtensionNames = feats, len(names), arr
        return original(physical, info, allocator)

    vk.vkCreateDevice = create


def print_props(dev: Device) -> None:
    feats = raw_struct(FEATURES, 12)
    vk.vkGetPhysicalDeviceFeatures2(dev.physical, vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=feats))
    print("features:", {n: int(feats[4 + i]) for i, n in enumerate(FEATURE_NAMES)})
    props = raw_struct(PROPS, 8)
    vk.vkGetPhysicalDeviceProperties2(dev.physical, vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=props))
    print("properties: workgroupScopeMaxWorkgroupSize", props[4], "flexibleDimensionsMaxDimension", props[5],
          "workgroupScopeReservedSharedMemory", props[6])
    fn = vk.lib.vkGetInstanceProcAddr(dev.instance, b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")
    query = vk.ffi.cast("VkResult(*)(VkPhysicalDevice, uint32_t*, void*)", fn)
    count = vk.ffi.new("uint32_t*")
    query(dev.physical, count, vk.ffi.NULL)
    items = vk.ffi.new(f"uint32_t[{14 * count[0]}]")
    for i in range(count[0]):
        vk.ffi.cast("VkBaseOutStructure*", items + 14 * i).sType = FLEX
    query(dev.physical, count, items)
    names = ("M", "N", "K", "A", "B", "C", "R", "sat", "scope", "invocations")
    for i in range(count[0]):
        print("flexible:", dict(zip(names, (items[14 * i + 4 + j] for j in range(10)))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spv", nargs="?")
    parser.add_argument("--props", action="store_true")
    parser.add_argument("--tokens", default="4096,16384")
    args = parser.parse_args()
    patch_create_device()
    dev = Device(None)
    if args.props:
        print_props(dev)
        return
    spv = Path(args.spv).resolve()
    m = re.match(r"cm2_(\d+)_(\d+)x(\d+)x(\d+)", spv.stem)
    tile, kstep = ((int(m.group(2)), int(m.group(3))), int(m.group(4))) if m else ((128, 128), 64)
    register(spv, "gemm_coop")
    mem, kern = Memory(dev), Kernels(dev)
    rng = np.random.default_rng(1)
    M, N, K = 2 * tile[0], 2 * tile[1], 8 * kstep
    a, b = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((N, K)).astype(np.float16)
    _, c = run_gemm(kern, mem, M, N, K, tile, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    err = float(np.abs(c - want).max() / np.abs(want).max())
    print(f"{spv.name}: check ({M} x {N} x {K}) max error {err:.2e}", flush=True)
    if err > 1e-5:
        sys.exit("wrong; no timings")
    cfg = shape_config("4b")
    H, I = cfg.hidden_size, cfg.intermediate_size
    for T in map(int, args.tokens.split(",")):
        gemms = {"qkv": (T, cfg.q_width + 2 * cfg.kv_width, H), "o": (T, H, cfg.q_width), "gate+up": (T, 2 * I, H),
                 "down": (T, H, I)}
        flops_all = secs_all = 0.0
        parts = []
        for name, (M, N, K) in gemms.items():
            if M % tile[0] or N % tile[1] or K % kstep:
                parts.append(f"{name} n/a")
                continue
            s, _ = run_gemm(kern, mem, M, N, K, tile)
            flops_all, secs_all = flops_all + 2 * M * N * K, secs_all + s
            parts.append(f"{name} {s * 1e3:.3f} ms {2 * M * N * K / s / 1e12:.1f}")
        print(f"{spv.name} T={T}: " + ", ".join(parts) + f"; layer {flops_all / secs_all / 1e12:.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
