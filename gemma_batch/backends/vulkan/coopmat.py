"""Whether a device runs the cooperative-matrix (tensor core) matmuls, and the features they need.

`shaders/matmul_coop.comp` multiplies 16 x 16 x 16 fp16 tiles with fp32 accumulation in
subgroups of 32 (`VK_KHR_cooperative_matrix`; its SPIR-V declares Float16 and the Vulkan memory
model). A device runs it when it lists that tile at subgroup scope, has the cooperativeMatrix,
shaderFloat16 and vulkanMemoryModel features, and runs compute shaders in subgroups of 32
(the kernel's workgroups are 4 subgroups of 32). Everywhere else the portable `matmul.comp`
runs. `GEMMA_BATCH_VK_DISABLE_COOPMAT=1` turns the fast path off on any device.

Inputs (`GEMMA_BATCH_VK_COOPMAT_INPUTS`): `split` multiplies each input row as fp16 hi + lo
halves of the row scaled by a power of two (22 significant bits, near-fp32 sums); `fp16`
multiplies the hi halves alone (11 significant bits, as fp16 activations elsewhere but with the
row's own scale, so nothing overflows), half the matrix work. Unset, the KV dtype decides: fp32
pages ask for fp32 numerics and get `split`; fp16 (the default), bf16 and int8 pages get `fp16`,
whose error is of the size those pages' own rounding already has (4b prefill on the H100: the
8,192-token step 410.5 against 501.5 ms; the demo model's held-out perplexity +0.0001% against
the CPU backend, docs/EXPERIMENTS.md, "fp16 inputs by default").

The choice is made once per device, never per step: the two paths sum in different orders, and
a row's result must not depend on what else is in its batch.
"""

from __future__ import annotations

import os

from ...switches import switched_on

DISABLE_ENV = "GEMMA_BATCH_VK_DISABLE_COOPMAT"
INPUTS_ENV = "GEMMA_BATCH_VK_COOPMAT_INPUTS"
INPUTS = ("split", "fp16")
EXTENSION = "VK_KHR_cooperative_matrix"
COMPONENT_F16, COMPONENT_F32 = 0, 1  # VkComponentTypeKHR
SCOPE_SUBGROUP = 3  # VK_SCOPE_SUBGROUP_KHR
TILE = 16
SUBGROUP = 32


def has_fp16_tiles(vk, instance, physical) -> bool:
    """The device lists 16x16x16 fp16 x fp16 -> fp32 tiles at subgroup scope."""
    try:
        query = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        props = query(physical)
    except Exception:  # noqa: BLE001 - an old loader, binding or driver without the entry point
        return False
    return any(
        p.MSize == TILE and p.NSize == TILE and p.KSize == TILE and p.AType == COMPONENT_F16
        and p.BType == COMPONENT_F16 and p.CType == COMPONENT_F32 and p.ResultType == COMPONENT_F32
        and p.scope == SCOPE_SUBGROUP
        for p in props
    )


def supported(vk, instance, physical, extensions: frozenset[str], subgroup_size: int) -> bool:
    """Whether the device can run matmul_coop.comp (the user's switch aside)."""
    if EXTENSION not in extensions or subgroup_size != SUBGROUP:
        return False
    f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES)
    model = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, pNext=f16)
    coop = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, pNext=model)
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=coop))
    return (bool(coop.cooperativeMatrix) and bool(model.vulkanMemoryModel) and bool(f16.shaderFloat16)
            and has_fp16_tiles(vk, instance, physical))


def wanted() -> bool:
    """The user's switch: GEMMA_BATCH_VK_DISABLE_COOPMAT=1 turns the cooperative-matrix path off."""
    return not switched_on(DISABLE_ENV, default=False)


def split_inputs(kv_dtype: str) -> bool:
    """The inputs for a backend with KV pages of `kv_dtype` (--kv-dtype): True for hi + lo, False
    for fp16; the user's GEMMA_BATCH_VK_COOPMAT_INPUTS if set, else split for fp32 pages only."""
    value = os.environ.get(INPUTS_ENV, "").strip().lower() or ("split" if kv_dtype == "fp32" else "fp16")
    if value not in INPUTS:
        raise ValueError(f"{INPUTS_ENV}={value!r}: expected one of {', '.join(INPUTS)}")
    return value == "split"


def enable_chain(vk, pnext, f16):
    """Feature structs that enable cooperative matrices and the Vulkan memory model, chained
    before `pnext`; `f16` (a VkPhysicalDeviceShaderFloat16Int8Features already in that chain)
    gets shaderFloat16. Returns (the new head of the chain, the struct it points to): keep both
    alive until the device exists."""
    f16.shaderFloat16 = vk.VK_TRUE
    model = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, pNext=pnext,
        vulkanMemoryModel=vk.VK_TRUE)
    return vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, pNext=model,
        cooperativeMatrix=vk.VK_TRUE), model
