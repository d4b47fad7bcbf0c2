"""What the driver says about each compiled kernel (VK_KHR_pipeline_executable_properties).

On drivers that expose the extension (NVIDIA's, RADV, ...), a `Device(capture_statistics=True)`
builds every pipeline with its statistics kept, and `statistics(kernels, name)` returns them by
the driver's names: on the H100 "Register Count" (per invocation), "Shared Memory Size",
"Binary Size", "Local Memory Size" and "Stack Size". Registers and shared memory decide how many
workgroups a compute unit holds at once, and so how many of a dispatch's workgroups run in its
first wave (benchmarks/kernel_stats.py prints them for every kernel). Diagnostics only: the
backend never asks for them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

EXTENSION = "VK_KHR_pipeline_executable_properties"


def enable_chain(vk, pnext):
    """The feature struct that enables the extension's pipelineExecutableInfo, before `pnext`."""
    return vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, pNext=pnext,
        pipelineExecutableInfo=vk.VK_TRUE)


def statistics(kernels, name: str) -> dict[str, int | float | bool]:
    """The driver's statistics of kernel `name`'s pipeline (built now if it is not yet), {} when
    its device was not created with `capture_statistics` or lacks the extension."""
    dev = kernels.dev
    pipe = kernels.pipeline(name)
    if not dev.statistics:
        return {}
    vk = dev.vk
    count = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutablePropertiesKHR")
    if not list(count(dev.device, vk.VkPipelineInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, pipeline=pipe))):
        return {}
    stats = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutableStatisticsKHR")
    info = vk.VkPipelineExecutableInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, pipeline=pipe,
                                          executableIndex=0)  # a compute pipeline has one executable
    member = {vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: "b32", vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: "i64",
              vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: "u64", vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: "f64"}
    out: dict[str, int | float | bool] = {}
    for s in list(stats(dev.device, info)):
        key = s.name if isinstance(s.name, str) else vk.ffi.string(s.name).decode()
        value = getattr(s.value, member[s.format])
        out[key] = bool(value) if member[s.format] == "b32" else value
    return out


def workgroup_size(spv: bytes, constants: Sequence[int] = ()) -> int:
    """Invocations per workgroup of a compute shader's SPIR-V: its LocalSize execution mode, or,
    where specialization constants size it (GLSL local_size_x_id: the WorkgroupSize built-in),
    their values in `constants` (by constant id, as kernels.Kernels.constants; the shader's
    defaults for ids past its end)."""
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    local, spec_ids, values, composites, builtin = None, {}, {}, {}, None
    i = 5  # past the header
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if opcode == 16 and words[i + 2] == 17:  # OpExecutionMode %entry LocalSize x y z
            local = words[i + 3] * words[i + 4] * words[i + 5]
        elif opcode == 71 and words[i + 2] == 1:  # OpDecorate %c SpecId n
            spec_ids[words[i + 1]] = words[i + 3]
        elif opcode == 71 and words[i + 2] == 11 and words[i + 3] == 25:  # OpDecorate %v BuiltIn WorkgroupSize
            builtin = words[i + 1]
        elif opcode in (43, 50):  # OpConstant / OpSpecConstant %type %c value (32-bit)
            values[words[i + 2]] = words[i + 3]
        elif opcode == 51:  # OpSpecConstantComposite %type %v x y z
            composites[words[i + 2]] = words[i + 3:i + count]
        i += max(count, 1)
    if builtin in composites:
        size = 1
        for c in composites[builtin]:
            sid = spec_ids.get(c)
            size *= constants[sid] if sid is not None and sid < len(constants) else values[c]
        return size
    if local is None:
        raise ValueError("no LocalSize execution mode in the SPIR-V")
    return local
