"""Time gemm_cm2.comp's builds (VK_NV_cooperative_matrix2 workgroup-scope matrices, tensor loads)
against benchmarks/gemm_coop.comp (the KHR prefill yardstick) on the 4b layer's GEMMs and a square
4096 GEMM; every build first checked against numpy, every timed GEMM checked on sampled rows.

    python3 .exp/cm2/run_cm2.py .exp/cm2/*.spv benchmarks/gemm_coop.spv   # from the repo root
    python3 .exp/cm2/run_cm2.py --props        # the device's coopmat2 features, properties, sizes

With builds given, the device description runs first, then each build in its own process (a bad
build may lose the device or hang: --timeout kills it), then a table of TFLOP/s per GEMM and
build. Options: --tokens 4096,16384 (rows of the layer GEMMs), --shape 4b, --repeats 5,
--json PATH (all results), --strict (skip a build whose tile the device does not advertise).

Builds are named by build.py: cm2t_<WG>_<BM>x<BN>x<BK>[_g<GM>][_spec].spv (BM x BN tile of C per
workgroup of WG invocations, BK per step; _spec: M, N, K as specialization constants 0-2);
gemm_coop*.spv is the yardstick (128 x 128 tiles, 256 invocations, K step 64). Dry runs where
neither can run (Mesa llvmpipe): test/scalar_256_16x16x8[_spec].spv, from test_scalar.comp, e.g.
    python3 .exp/cm2/run_cm2.py .exp/cm2/test/*.spv --tokens 64 --square 256

The device: gemma_batch's Device, with the instance asking for Vulkan 1.3 (the builds are SPIR-V
1.6) and vkCreateDevice wrapped to add VK_NV_cooperative_matrix2 (workgroupScope,
flexibleDimensions, tensorAddressing), and to make sure of KHR cooperativeMatrix,
vulkanMemoryModel (+DeviceScope where offered), shaderFloat16, storageBuffer16BitAccess,
subgroupSizeControl, computeFullSubgroups and maintenance4 (the pip `vulkan` 1.3.275 binding
predates coopmat2: its structs are raw words here; sTypes 1000593000/1/2). Pipelines are built
here with REQUIRE_FULL_SUBGROUPS and a required subgroup size of 32 where the device allows,
and with the driver's statistics kept (VK_KHR_pipeline_executable_properties) where offered.
Timing: per GEMM C is filled with NaN, one warm-up dispatch, then `--repeats` submits of
[timestamp, dispatch, barrier, timestamp], best taken.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CM2_EXT = "VK_NV_cooperative_matrix2"
KHR_EXT = "VK_KHR_cooperative_matrix"
SSC_EXT = "VK_EXT_subgroup_size_control"
ST_CM2_FEATURES, ST_CM2_FLEX, ST_CM2_PROPS = 1000593000, 1000593001, 1000593002
# VkPhysicalDeviceCooperativeMatrix2FeaturesNV: sType, (pad), pNext = words 0-3, then these VkBool32
CM2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                "cooperativeMatrixReductions", "cooperativeMatrixConversions",
                "cooperativeMatrixPerElementOperations", "cooperativeMatrixTensorAddressing",
                "cooperativeMatrixBlockLoads")
CM2_NEEDED = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
              "cooperativeMatrixTensorAddressing")
# VkPhysicalDeviceCooperativeMatrix2PropertiesNV: words 4-6
CM2_PROPS = ("cooperativeMatrixWorkgroupScopeMaxWorkgroupSize", "cooperativeMatrixFlexibleDimensionsMaxDimension",
             "cooperativeMatrixWorkgroupScopeReservedSharedMemory")
# VkCooperativeMatrixFlexibleDimensionsPropertiesNV: 14 words, these from word 4
FLEX_FIELDS = ("MGranularity", "NGranularity", "KGranularity", "AType", "BType", "CType", "ResultType",
               "saturatingAccumulation", "scope", "workgroupInvocations")
COMPONENT = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8", 8: "u16", 9: "u32",
             10: "u64", 1000141000: "bf16", 1000491002: "e4m3", 1000491003: "e5m2"}
SCOPE = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue family"}
STAGE_REQUIRE_FULL_SUBGROUPS = 0x2  # VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT
RESULT_TAG = "RESULT "  # a child's results so far (JSON), after the check and after each GEMM
KEEP: list = []  # cffi objects that must outlive the calls they were passed to
START = time.perf_counter()


# --------------------------------------------------------------------------------------------
# builds and GEMMs

@dataclass(frozen=True)
class Build:
    path: Path
    kind: str  # "cm2", "khr", or "test" (test_scalar.comp: dry runs where neither can run)
    wg: int
    bm: int
    bn: int
    bk: int
    gm: int = 0
    spec: bool = False

    @property
    def name(self) -> str:
        return self.path.stem

    def fits(self, M: int, N: int, K: int) -> bool:
        return M % self.bm == 0 and N % self.bn == 0 and K % self.bk == 0 and K % 8 == 0


def parse_build(path: Path) -> Build:
    m = re.fullmatch(r"(cm2t|scalar)_(\d+)_(\d+)x(\d+)x(\d+)(?:_g(\d+))?(_spec)?", path.stem)
    if m:
        return Build(path, "cm2" if m[1] == "cm2t" else "test", int(m[2]), int(m[3]), int(m[4]), int(m[5]),
                     int(m[6] or 0), bool(m[7]))
    if path.stem.startswith("gemm_coop"):
        return Build(path, "khr", 256, 128, 128, 64)
    raise SystemExit(f"{path}: not a cm2t_<WG>_<BM>x<BN>x<BK>[_g<GM>][_spec].spv build nor gemm_coop*.spv")


def model_gemms(shape: str, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of a layer's four matmuls at `tokens` rows (as benchmarks/gemm_coop.py)."""
    from gemma_batch.bench.shapes import shape_config

    cfg = shape_config(shape)
    T, H, I = tokens, cfg.hidden_size, cfg.intermediate_size
    return {"qkv": (T, cfg.q_width + 2 * cfg.kv_width, H), "o": (T, H, cfg.q_width), "gate+up": (T, 2 * I, H),
            "down": (T, H, I)}


def gemm_list(shape: str, tokens: list[int], square: int = 4096) -> list[tuple[str, int, str, tuple[int, int, int]]]:
    out = [("-", 0, f"square {square}", (square, square, square))] if square else []
    for T in tokens:
        out += [(shape, T, name, mnk) for name, mnk in model_gemms(shape, T).items()]
    return out


# --------------------------------------------------------------------------------------------
# device: capabilities, and the feature chain added to gemma_batch's Device

def raw_struct(vk, stype: int, words: int, pnext=None):
    raw = vk.ffi.new(f"uint32_t[{words}]")
    base = vk.ffi.cast("VkBaseOutStructure*", raw)
    base.sType = stype
    base.pNext = vk.ffi.cast("VkBaseOutStructure*", pnext) if pnext is not None else vk.ffi.NULL
    return raw


def _version(v: int) -> tuple[int, int]:
    return (v >> 22) & 0x7F, (v >> 12) & 0x3FF


def query_caps(vk, physical) -> dict:
    """What the device offers of everything the builds need (no instance-level entry points)."""
    exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
    props = vk.vkGetPhysicalDeviceProperties(physical)
    caps = {"extensions": exts, "api": _version(props.apiVersion), "name": props.deviceName,
            "max_shared": int(props.limits.maxComputeSharedMemorySize),
            "max_storage_buffer_range": int(props.limits.maxStorageBufferRange)}
    ffi = vk.ffi
    f16 = ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*")
    f16.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES
    s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*")
    s16.sType, s16.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, f16
    vmm = ffi.new("VkPhysicalDeviceVulkanMemoryModelFeatures*")
    vmm.sType, vmm.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, s16
    head = vmm
    ssc = m4 = khr = cm2 = None
    if caps["api"] >= (1, 3) or SSC_EXT in exts:
        ssc = ffi.new("VkPhysicalDeviceSubgroupSizeControlFeatures*")
        ssc.sType, ssc.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES, head
        head = ssc
    if caps["api"] >= (1, 3) or "VK_KHR_maintenance4" in exts:
        m4 = ffi.new("VkPhysicalDeviceMaintenance4Features*")
        m4.sType, m4.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES, head
        head = m4
    if KHR_EXT in exts:
        khr = ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*")
        khr.sType, khr.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, head
        head = khr
    if CM2_EXT in exts:
        cm2 = raw_struct(vk, ST_CM2_FEATURES, 12, head)
        head = cm2
    feats2 = ffi.new("VkPhysicalDeviceFeatures2*")
    feats2.sType, feats2.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, ffi.cast("void*", head)
    vk.lib.vkGetPhysicalDeviceFeatures2(physical, feats2)
    caps["features"] = {
        "shaderFloat16": bool(f16.shaderFloat16), "storageBuffer16BitAccess": bool(s16.storageBuffer16BitAccess),
        "vulkanMemoryModel": bool(vmm.vulkanMemoryModel),
        "vulkanMemoryModelDeviceScope": bool(vmm.vulkanMemoryModelDeviceScope),
        "subgroupSizeControl": bool(ssc.subgroupSizeControl) if ssc is not None else False,
        "computeFullSubgroups": bool(ssc.computeFullSubgroups) if ssc is not None else False,
        "maintenance4": bool(m4.maintenance4) if m4 is not None else False,
        "cooperativeMatrix": bool(khr.cooperativeMatrix) if khr is not None else False,
        **{n: bool(cm2[4 + i]) if cm2 is not None else False for i, n in enumerate(CM2_FEATURES)},
    }
    # properties: subgroup size control, coopmat2
    sscp = ffi.new("VkPhysicalDeviceSubgroupSizeControlProperties*")
    sscp.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES
    head = sscp
    cm2p = None
    if CM2_EXT in exts:
        cm2p = raw_struct(vk, ST_CM2_PROPS, 8, sscp)
        head = cm2p
    props2 = ffi.new("VkPhysicalDeviceProperties2*")
    props2.sType, props2.pNext = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, ffi.cast("void*", head)
    vk.lib.vkGetPhysicalDeviceProperties2(physical, props2)
    ssc_ok = caps["api"] >= (1, 3) or SSC_EXT in exts
    caps["subgroup"] = {"min": int(sscp.minSubgroupSize), "max": int(sscp.maxSubgroupSize),
                        "required_stages": int(sscp.requiredSubgroupSizeStages)} if ssc_ok else None
    caps["cm2_props"] = {n: int(cm2p[4 + i]) for i, n in enumerate(CM2_PROPS)} if cm2p is not None else None
    return caps


def flexible_sizes(vk, instance, physical) -> list[dict] | None:
    """vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV's list (None without it)."""
    fn = vk.lib.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")
    if fn == vk.ffi.NULL:
        return None
    query = vk.ffi.cast("VkResult(*)(VkPhysicalDevice, uint32_t*, void*)", fn)
    count = vk.ffi.new("uint32_t*")
    if query(physical, count, vk.ffi.NULL) != 0:
        return None
    items = vk.ffi.new(f"uint32_t[{14 * max(count[0], 1)}]")
    for i in range(count[0]):
        vk.ffi.cast("VkBaseOutStructure*", items + 14 * i).sType = ST_CM2_FLEX
    if query(physical, count, items) not in (0, 5):  # VK_SUCCESS, VK_INCOMPLETE
        return None
    return [dict(zip(FLEX_FIELDS, (int(items[14 * i + 4 + j]) for j in range(10)))) for i in range(count[0])]


def _walk(vk, pnext) -> dict[int, object]:
    """sType -> struct pointer of a pNext chain."""
    out, p = {}, vk.ffi.cast("VkBaseOutStructure*", pnext)
    while p != vk.ffi.NULL:
        out[int(p.sType)] = p
        p = p.pNext
    return out


def open_device(want_cm2: bool):
    """gemma_batch's Device on Vulkan 1.3 with the features above enabled (those offered). Returns
    (device, caps, enabled feature names)."""
    import vulkan as vk

    from gemma_batch.backends.vulkan import device as devmod

    original_instance, original_create = devmod.create_instance, vk.vkCreateDevice

    def create_instance(vk_):
        try:
            loader = vk_.vkEnumerateInstanceVersion()
        except Exception:  # noqa: BLE001 - a 1.0 loader
            loader = vk_.VK_MAKE_VERSION(1, 0, 0)
        api = vk_.VK_MAKE_VERSION(1, 3, 0) if loader >= vk_.VK_MAKE_VERSION(1, 3, 0) else vk_.VK_MAKE_VERSION(1, 2, 0)
        app = vk_.VkApplicationInfo(sType=vk_.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="run_cm2",
                                    applicationVersion=1, pEngineName="gemma-batch", engineVersion=1, apiVersion=api)
        return vk_.vkCreateInstance(vk_.VkInstanceCreateInfo(sType=vk_.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                                             pApplicationInfo=app), None)

    state: dict = {}

    def create_device(physical, info, allocator, pDevice=None):
        caps = query_caps(vk, physical)
        f = caps["features"]
        ffi = vk.ffi
        names = [ffi.string(info.ppEnabledExtensionNames[i]).decode() for i in range(info.enabledExtensionCount)]
        chain = _walk(vk, info.pNext)
        head = info.pNext
        enabled = []

        def ensure(stype: int, ctype: str):
            nonlocal head
            if stype in chain:
                return ffi.cast(ctype + "*", chain[stype])
            s = ffi.new(ctype + "*")
            s.sType, s.pNext = stype, ffi.cast("void*", head)
            KEEP.append(s)
            head = s
            chain[stype] = s
            return s

        def turn_on(struct, field: str, key: str | None = None) -> None:
            if f[key or field]:
                setattr(struct, field, 1)
                enabled.append(key or field)

        s16 = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, "VkPhysicalDevice16BitStorageFeatures")
        turn_on(s16, "storageBuffer16BitAccess")
        f16 = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, "VkPhysicalDeviceShaderFloat16Int8Features")
        turn_on(f16, "shaderFloat16")
        vmm = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, "VkPhysicalDeviceVulkanMemoryModelFeatures")
        turn_on(vmm, "vulkanMemoryModel")
        turn_on(vmm, "vulkanMemoryModelDeviceScope")
        if f["subgroupSizeControl"] or f["computeFullSubgroups"]:
            ssc = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES,
                         "VkPhysicalDeviceSubgroupSizeControlFeatures")
            turn_on(ssc, "subgroupSizeControl")
            turn_on(ssc, "computeFullSubgroups")
            if caps["api"] < (1, 3) and SSC_EXT not in names:
                names.append(SSC_EXT)
        if f["maintenance4"]:
            m4 = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES, "VkPhysicalDeviceMaintenance4Features")
            turn_on(m4, "maintenance4")
            if caps["api"] < (1, 3) and "VK_KHR_maintenance4" not in names:
                names.append("VK_KHR_maintenance4")
        if f["cooperativeMatrix"]:
            khr = ensure(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
                         "VkPhysicalDeviceCooperativeMatrixFeaturesKHR")
            turn_on(khr, "cooperativeMatrix")
            if KHR_EXT not in names:
                names.append(KHR_EXT)
        if want_cm2 and CM2_EXT in caps["extensions"]:
            cm2 = raw_struct(vk, ST_CM2_FEATURES, 12, head)
            KEEP.append(cm2)
            head = cm2
            for i, n in enumerate(CM2_FEATURES):
                if n in CM2_NEEDED and f[n]:
                    cm2[4 + i] = 1
                    enabled.append(n)
            names.append(CM2_EXT)
        cnames = [ffi.new("char[]", n.encode()) for n in names]
        arr = ffi.new("char*[]", cnames)
        KEEP.extend([cnames, arr])
        info.pNext = ffi.cast("void*", head)
        info.enabledExtensionCount, info.ppEnabledExtensionNames = len(names), arr
        state.update(caps=caps, enabled=enabled, extensions=names)
        return original_create(physical, info, allocator, pDevice) if pDevice is not None else \
            original_create(physical, info, allocator)

    devmod.create_instance, vk.vkCreateDevice = create_instance, create_device
    try:
        dev = devmod.Device(None, capture_statistics=True)
    finally:
        devmod.create_instance, vk.vkCreateDevice = original_instance, original_create
    return dev, state["caps"], state["enabled"], state["extensions"]


def print_props(dev, caps: dict, enabled: list[str], extensions: list[str]) -> list[dict] | None:
    vk = dev.vk
    info = dev.info
    print(f"device: {info.name}; driver {info.driver}; Vulkan {caps['api'][0]}.{caps['api'][1]} "
          f"(instance asked 1.3); SMs {info.sm_count or '?'}; subgroup {info.subgroup_size}; "
          f"max shared memory {caps['max_shared']} B; max storage buffer {caps['max_storage_buffer_range'] / 2**20:.0f} MiB")
    print(f"extensions: {CM2_EXT} {'yes' if CM2_EXT in caps['extensions'] else 'NO'}, "
          f"{KHR_EXT} {'yes' if KHR_EXT in caps['extensions'] else 'NO'}, "
          f"pipeline statistics {'yes' if dev.statistics else 'no'}")
    print("features offered:", {k: int(v) for k, v in caps["features"].items()})
    print("features enabled:", enabled)
    print("device extensions enabled:", extensions)
    print("subgroup size control:", caps["subgroup"])
    print("coopmat2 properties:", caps["cm2_props"])
    flex = flexible_sizes(vk, dev.instance, dev.physical) if CM2_EXT in caps["extensions"] else None
    if flex is None:
        print("coopmat2 flexible sizes: none (no VK_NV_cooperative_matrix2)")
    else:
        print(f"coopmat2 flexible sizes ({len(flex)}):")
        for p in flex:
            print(f"  M/N/K granularity {p['MGranularity']}/{p['NGranularity']}/{p['KGranularity']} "
                  f"A {COMPONENT.get(p['AType'], p['AType'])} B {COMPONENT.get(p['BType'], p['BType'])} "
                  f"C {COMPONENT.get(p['CType'], p['CType'])} result {COMPONENT.get(p['ResultType'], p['ResultType'])} "
                  f"saturating {p['saturatingAccumulation']} scope {SCOPE.get(p['scope'], p['scope'])} "
                  f"invocations {p['workgroupInvocations']}")
    try:
        props = vk.vkGetInstanceProcAddr(dev.instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")(dev.physical)
        sizes = sorted({(p.MSize, p.NSize, p.KSize, COMPONENT.get(p.AType, p.AType), COMPONENT.get(p.CType, p.CType),
                         SCOPE.get(p.scope, p.scope)) for p in props})
        print("KHR cooperative matrix sizes:", sizes)
    except Exception as e:  # noqa: BLE001
        print("KHR cooperative matrix sizes: none", f"({type(e).__name__})")
    return flex


# --------------------------------------------------------------------------------------------
# pipelines, dispatches, timing

class Runner:
    def __init__(self, dev, caps: dict, build: Build) -> None:
        from gemma_batch.backends.vulkan.kernels import Kernels
        from gemma_batch.backends.vulkan.memory import Memory

        self.dev, self.vk, self.caps, self.build = dev, dev.vk, caps, build
        self.mem, self.kern = Memory(dev), Kernels(dev)
        self.code = build.path.read_bytes()
        self.module = None
        self.pipelines: dict[tuple, object] = {}
        self.stage_flags, self.subgroup = 0, None
        f, sg = caps["features"], caps["subgroup"]
        if f["computeFullSubgroups"]:
            self.stage_flags |= STAGE_REQUIRE_FULL_SUBGROUPS
        if (f["subgroupSizeControl"] and sg and sg["min"] <= 32 <= sg["max"]
                and sg["required_stages"] & self.vk.VK_SHADER_STAGE_COMPUTE_BIT and build.wg % 32 == 0):
            self.subgroup = 32

    def pipeline(self, M: int, N: int, K: int):
        vk, ffi = self.vk, self.vk.ffi
        key = (M, N, K) if self.build.spec else ()
        if key in self.pipelines:
            return self.pipelines[key]
        if self.module is None:
            self.module = vk.vkCreateShaderModule(self.dev.device, vk.VkShaderModuleCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(self.code), pCode=self.code), None)
        keep = []
        stage = ffi.new("VkComputePipelineCreateInfo*")
        stage.sType = vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO
        stage.flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if self.dev.statistics else 0
        stage.layout = self.kern.layout
        s = stage.stage
        s.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO
        s.flags = self.stage_flags
        s.stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
        s.module = self.module
        entry = ffi.new("char[]", b"main")
        keep.append(entry)
        s.pName = entry
        if self.subgroup:
            req = ffi.new("VkPipelineShaderStageRequiredSubgroupSizeCreateInfo*")
            req.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO
            req.requiredSubgroupSize = self.subgroup
            keep.append(req)
            s.pNext = req
        if self.build.spec:
            values = np.array([M, N, K], np.uint32)
            entries = ffi.new("VkSpecializationMapEntry[3]")
            for i in range(3):
                entries[i].constantID, entries[i].offset, entries[i].size = i, 4 * i, 4
            data = ffi.new("uint32_t[3]", [int(v) for v in values])
            spec = ffi.new("VkSpecializationInfo*")
            spec.mapEntryCount, spec.pMapEntries, spec.dataSize, spec.pData = 3, entries, 12, data
            keep += [entries, data, spec]
            s.pSpecializationInfo = spec
        out = ffi.new("VkPipeline*")
        rc = vk.lib.vkCreateComputePipelines(self.dev.device, ffi.NULL, 1, stage, ffi.NULL, out)
        if rc != 0:
            raise RuntimeError(f"vkCreateComputePipelines failed: VkResult {rc}")
        self.pipelines[key] = out[0]
        return out[0]

    def statistics(self, pipe) -> dict:
        from gemma_batch.backends.vulkan import pipeline_stats

        class One:  # what pipeline_stats.statistics asks of a Kernels
            dev = self.dev

            @staticmethod
            def pipeline(_name):
                return pipe

        try:
            return pipeline_stats.statistics(One, "x")
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"}

    def groups(self, M: int, N: int) -> int:
        return (M // self.build.bm) * (N // self.build.bn)

    def record(self, cb, M: int, N: int, K: int, dset) -> None:
        vk = self.vk
        vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline(M, N, K))
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.kern.layout, 0, 1, [dset], 0, None)
        raw = np.array([M, N, K, 0], np.uint32).tobytes()
        vk.vkCmdPushConstants(cb, self.kern.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(raw), vk.ffi.from_buffer(raw))
        vk.vkCmdDispatch(cb, self.groups(M, N), 1, 1)
        self.kern._barrier(cb)

    def run(self, A, B, C, M: int, N: int, K: int, repeats: int) -> float:
        """Best GPU seconds of `repeats` timed dispatches after C is NaN-filled and one warm-up."""
        from gemma_batch.backends.vulkan.timestamps import Timestamps

        vk, dev = self.vk, self.dev
        dset = self.kern.descriptor_set({0: A, 1: B, 2: C}, C)
        self.pipeline(M, N, K)  # built outside the command buffers
        stamps = Timestamps(dev, 2)
        warm, timed = dev.command_buffer(), dev.command_buffer()
        begin = vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO)
        try:
            vk.vkBeginCommandBuffer(warm, begin)
            vk.vkCmdFillBuffer(warm, C.handle, 0, (M * N * 4 + 3) // 4 * 4, 0xFFFFFFFF)  # NaN: unwritten tiles show
            self.kern._barrier(warm, src_stage=vk.VK_PIPELINE_STAGE_TRANSFER_BIT, src=vk.VK_ACCESS_TRANSFER_WRITE_BIT)
            self.record(warm, M, N, K, dset)
            vk.vkEndCommandBuffer(warm)
            dev.submit_and_wait(warm)
            vk.vkBeginCommandBuffer(timed, begin)
            stamps.reset(timed)
            stamps.write(timed, 0)
            self.record(timed, M, N, K, dset)
            stamps.write(timed, 1)
            self.kern._barrier(timed, dst_stage=vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                               dst=vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)
            vk.vkEndCommandBuffer(timed)
            best = float("inf")
            for _ in range(repeats):
                dev.submit_and_wait(timed)
                best = min(best, float(stamps.seconds(2)[0]))
            return best
        finally:
            vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 2, [warm, timed])
            stamps.free()


def advertised(build: Build, caps: dict, flex: list[dict] | None) -> str | None:
    """None when the device lists the build's workgroup-scope fp16 x fp16 -> fp32 tile, else why not."""
    if build.kind != "cm2":
        return None
    if flex is None:
        return "no flexible-size list"
    p = caps["cm2_props"] or {}
    if build.wg > p.get("cooperativeMatrixWorkgroupScopeMaxWorkgroupSize", 0):
        return f"WG {build.wg} > cooperativeMatrixWorkgroupScopeMaxWorkgroupSize {p.get('cooperativeMatrixWorkgroupScopeMaxWorkgroupSize')}"
    if max(build.bm, build.bn, build.bk) > p.get("cooperativeMatrixFlexibleDimensionsMaxDimension", 0):
        return f"a tile side > flexibleDimensionsMaxDimension {p.get('cooperativeMatrixFlexibleDimensionsMaxDimension')}"
    for e in flex:
        if (e["scope"] == 2 and e["AType"] == 0 and e["BType"] == 0 and e["CType"] == 1 and e["ResultType"] == 1
                and e["workgroupInvocations"] == build.wg and build.bm % e["MGranularity"] == 0
                and build.bn % e["NGranularity"] == 0 and build.bk % e["KGranularity"] == 0):
            return None
    return f"no workgroup-scope f16 x f16 -> f32 entry at {build.wg} invocations dividing {build.bm}x{build.bn}x{build.bk}"


def filled(mem, nbytes: int, block: np.ndarray, label: str):
    """A device buffer of `nbytes` holding `block` repeated (fp16)."""
    buf = mem.alloc(nbytes, label)
    n, L = nbytes // 2, block.size
    for start in range(0, n, L):
        mem.upload(buf, block[: min(L, n - start)], offset=2 * start)
    return buf


def repeated(block: np.ndarray, start: int, count: int) -> np.ndarray:
    """Elements start .. start+count of `block` repeated without end."""
    return block[(start + np.arange(count, dtype=np.int64)) % block.size]


def child(spv: Path, args) -> None:
    """One build: device, check, timings; prints its results so far as a RESULT line (JSON) after the
    check and after each GEMM (the parent keeps the last, so a build killed midway still counts)."""
    build = parse_build(spv)
    result = {"build": build.name, "kind": build.kind, "tile": [build.wg, build.bm, build.bn, build.bk, build.gm,
                                                                 build.spec], "gemms": []}
    try:
        dev, caps, enabled, _ = open_device(want_cm2=True)  # the same device for the yardstick
    except Exception as e:  # noqa: BLE001
        sys.exit(f"{build.name}: no device ({type(e).__name__}: {e})")
    f = caps["features"]
    if build.kind == "cm2":
        missing = [n for n in CM2_NEEDED if not f[n]]
        if CM2_EXT not in caps["extensions"] or missing:
            sys.exit(f"{build.name}: {dev.info.name} lacks {CM2_EXT}" + (f" features {missing}" if missing else "")
                     + "; cannot run coopmat2 builds")
        lacking = [n for n in ("cooperativeMatrix", "vulkanMemoryModel", "shaderFloat16", "storageBuffer16BitAccess")
                   if not f[n]]
        if lacking:
            sys.exit(f"{build.name}: {dev.info.name} lacks {lacking}")
        flex = flexible_sizes(dev.vk, dev.instance, dev.physical)
        why = advertised(build, caps, flex)
        if why:
            print(f"{build.name}: WARNING the device does not advertise this tile: {why}", flush=True)
            if args.strict:
                sys.exit(f"{build.name}: skipped (--strict)")
    elif build.kind == "khr" and not dev.info.coopmat_fp16:
        sys.exit(f"{build.name}: {dev.info.name} has no 16x16x16 fp16 KHR cooperative matrices at subgroup 32; "
                 "the yardstick cannot run here")
    run = Runner(dev, caps, build)
    print(f"{build.name}: stage flags {run.stage_flags:#x}, required subgroup size {run.subgroup}", flush=True)

    # correctness on a small problem: 3 x 2 tiles, K past the unrolled loop
    rng = np.random.default_rng(1)
    M, N, K = 3 * build.bm, 2 * build.bn, 11 * build.bk
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    mem = run.mem
    A, B, C = mem.alloc(a.nbytes, "A"), mem.alloc(b.nbytes, "B"), mem.alloc(M * N * 4, "C")
    mem.upload(A, a)
    mem.upload(B, b)
    t0 = time.perf_counter()
    run.run(A, B, C, M, N, K, 1)
    c = mem.download(C, M * N * 4).view(np.float32).reshape(M, N)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    err = float(np.abs(c - want).max() / np.abs(want).max())
    stats = run.statistics(run.pipeline(M, N, K))
    result.update(check={"M": M, "N": N, "K": K, "err": err}, stats=stats)
    print(RESULT_TAG + json.dumps(result), flush=True)
    print(f"{build.name}: check {M} x {N} x {K}: max error {err:.2e} of max |C| ({time.perf_counter() - t0:.1f} s "
          f"with the pipeline build)", flush=True)
    print(f"{build.name}: driver statistics {stats}", flush=True)
    for buf in (A, B, C):
        mem.free(buf)
    if not err < 1e-5:
        sys.exit(f"{build.name}: WRONG (error {err:.2e}); no timings")

    # timings: one A, B, C sized for the largest GEMM, random fp16 blocks repeated
    tokens = [int(t) for t in args.tokens.split(",") if t]
    todo, limit = [], caps["max_storage_buffer_range"]
    for shape, T, name, (M, N, K) in gemm_list(args.shape, tokens, args.square):
        row = {"shape": shape, "tokens": T, "gemm": name, "M": M, "N": N, "K": K}
        if not build.fits(M, N, K):
            row["skip"] = "tile"
        elif max(M * N * 4, M * K * 2, N * K * 2) > limit:
            row["skip"] = "buffer range"
        todo.append(row)
    live = [r for r in todo if "skip" not in r]
    b_cache: dict = {}
    if live:
        L = (1 << 24) - 3
        block_a = rng.standard_normal(L).astype(np.float16)
        block_b = rng.standard_normal(L).astype(np.float16)
        A = filled(mem, max(r["M"] * r["K"] for r in live) * 2, block_a, "A")
        B = filled(mem, max(r["N"] * r["K"] for r in live) * 2, block_b, "B")
        C = mem.alloc(max(r["M"] * r["N"] for r in live) * 4, "C")
    for row in todo:
        M, N, K = row["M"], row["N"], row["K"]
        label = f"{build.name} {row['shape']} T={row['tokens']} {row['gemm']} {M}x{N}x{K}"
        if "skip" in row:
            print(f"{label}: skipped ({row['skip']})", flush=True)
            result["gemms"].append(row)
            print(RESULT_TAG + json.dumps(result), flush=True)
            continue
        s = run.run(A, B, C, M, N, K, args.repeats)
        # check sampled rows of this very result (tile edges, middle, last) against numpy
        rows = sorted(r for r in {0, build.bm - 1, build.bm, M // 2 + 3, M - build.bm, M - 1} if 0 <= r < M)
        got = np.stack([mem.download(C, N * 4, offset=r * N * 4).view(np.float32) for r in rows])
        a_rows = np.stack([repeated(block_a, r * K, K) for r in rows]).astype(np.float64)
        if (N, K) not in b_cache:
            b_cache.clear()
            b_cache[(N, K)] = repeated(block_b, 0, N * K).reshape(N, K).astype(np.float64)
        b_full = b_cache[(N, K)]
        want = a_rows @ b_full.T
        gerr = float(np.abs(got - want).max() / np.abs(want).max())
        row.update(seconds=s, tflops=2 * M * N * K / s / 1e12, err=gerr, groups=run.groups(M, N))
        flag = "" if gerr < 1e-4 else "  WRONG"
        print(f"{label}: {s * 1e3:.3f} ms {row['tflops']:.1f} TFLOP/s ({row['groups']} workgroups; sampled-row "
              f"error {gerr:.1e}){flag}", flush=True)
        result["gemms"].append(row)
        print(RESULT_TAG + json.dumps(result), flush=True)
    for shape, T in dict.fromkeys((r["shape"], r["tokens"]) for r in todo if r["shape"] != "-"):
        layer = [r for r in todo if (r["shape"], r["tokens"]) == (shape, T)]
        if all("seconds" in r for r in layer):
            fl = sum(2 * r["M"] * r["N"] * r["K"] for r in layer)
            sec = sum(r["seconds"] for r in layer)
            print(f"{build.name} {shape} T={T} layer (4 GEMMs): {fl / sec / 1e12:.1f} TFLOP/s", flush=True)


def run_child(spv: Path, args, timeout: float) -> dict | None:
    """Run one build in its own process, echoing its output; its RESULT, or None."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(spv), "--tokens", args.tokens,
           "--shape", args.shape, "--repeats", str(args.repeats), "--square", str(args.square)] + (["--strict"] if args.strict else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    result = None
    try:
        for line in proc.stdout:
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
            else:
                print(line, end="", flush=True)
        proc.wait()
    finally:
        killed = not timer.is_alive() and proc.returncode not in (0, None)
        timer.cancel()
    if proc.returncode != 0:
        why = f"killed after {timeout:.0f} s" if killed else f"exit code {proc.returncode}"
        print(f"{spv.name}: {why}", flush=True)
    return result


def summary(results: list[dict]) -> None:
    if not results:
        return
    keys = []
    for r in results:
        for g in r["gemms"]:
            k = (g["shape"], g["tokens"], g["gemm"], g["M"], g["N"], g["K"])
            if k not in keys:
                keys.append(k)
    names = [r["build"] for r in results]
    width = max(12, *(len(n) for n in names))
    print("\nTFLOP/s (best of the repeats; '-' skipped, 'X' wrong)")
    print(f"{'gemm':28s} {'M x N x K':>22s} " + " ".join(f"{n:>{width}s}" for n in names))
    table = {(r["build"], (g["shape"], g["tokens"], g["gemm"], g["M"], g["N"], g["K"])): g
             for r in results for g in r["gemms"]}
    for k in keys:
        cells = []
        for n in names:
            g = table.get((n, k))
            cells.append("-" if not g or "tflops" not in g else
                         (f"{g['tflops']:.1f}" + ("X" if not g["err"] < 1e-4 else "")))
        label = f"{k[2]}" if k[0] == "-" else f"{k[0]} T={k[1]} {k[2]}"
        print(f"{label:28s} {f'{k[3]} x {k[4]} x {k[5]}':>22s} " + " ".join(f"{c:>{width}s}" for c in cells))
    for shape, T in dict.fromkeys((k[0], k[1]) for k in keys if k[0] != "-"):
        cells = []
        for r in results:
            layer = [g for g in r["gemms"] if (g["shape"], g["tokens"]) == (shape, T)]
            ok = layer and all("seconds" in g for g in layer)
            cells.append(f"{sum(2 * g['M'] * g['N'] * g['K'] for g in layer) / sum(g['seconds'] for g in layer) / 1e12:.1f}"
                         if ok else "-")
        print(f"{f'{shape} T={T} layer (4 GEMMs)':28s} {'':>22s} " + " ".join(f"{c:>{width}s}" for c in cells))
    for r in results:
        st = r.get("stats") or {}
        brief = {k: v for k, v in st.items() if any(w in k.lower() for w in ("register", "shared", "local", "spill"))}
        print(f"{r['build']}: check error {r.get('check', {}).get('err', float('nan')):.1e}; driver: {brief or st}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spv", nargs="*", type=Path)
    ap.add_argument("--props", action="store_true", help="print the device's coopmat2 capabilities")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--shape", default="4b")
    ap.add_argument("--square", type=int, default=4096, help="side of the square GEMM (0: none)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per build, at most")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for the whole run: builds that would start later are not run")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args)
        return
    builds = [parse_build(p) for p in args.spv]  # names checked before anything runs
    dev, caps, enabled, extensions = open_device(want_cm2=True)  # the description, always first
    print_props(dev, caps, enabled, extensions)
    dev.close()
    if not builds:
        return
    builds = [b for b in builds if b.kind == "khr"] + [b for b in builds if b.kind != "khr"]  # yardstick first
    print(f"builds: {', '.join(b.name for b in builds)}; tokens {args.tokens}; shape {args.shape}", flush=True)
    results = []
    for b in builds:
        left = args.budget - (time.perf_counter() - START)
        if left < 20:
            print(f"{b.name}: not run (--budget {args.budget:.0f} s spent)", flush=True)
            continue
        t0 = time.perf_counter()
        r = run_child(b.path, args, min(args.timeout, left))
        print(f"{b.name}: {time.perf_counter() - t0:.1f} s", flush=True)
        if r is not None:
            results.append(r)
    summary(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    elif os.environ.get("OUT"):
        Path(os.environ["OUT"], "cm2_results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
