"""Vulkan instance, physical-device choice and description, and the logical device with one queue.

Device choice: `GEMMA_BATCH_VK_DEVICE` (or `--device`) names a device by index in
`gemma-batch devices` or by a piece of its name; otherwise a discrete GPU, then an integrated
one, then a virtual one, then a CPU implementation (Mesa's llvmpipe).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import coopmat, pipeline_stats
from .errors import VulkanUnavailable

DEVICE_ENV = "GEMMA_BATCH_VK_DEVICE"
SYNC_FENCE = -1  # the fence of submit_and_wait; 0, 1, ... are the steps in flight (backend.submit)
_TYPE_NAMES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
_PREFERENCE = {2: 0, 1: 1, 3: 2, 4: 3, 0: 4}  # device type -> rank (lower is preferred)

# What the shaders need of a device, beyond Vulkan 1.1 minimums.
NEEDS_WORKGROUP = 1024        # sample.comp: 1024 invocations per row
NEEDS_SHARED = 28 * 1024      # sample.comp: ~27.7 KiB of histograms and copied elements
NEEDS_STORAGE_BUFFERS = 16    # kernels.NUM_BINDINGS
NEEDS_PUSH_BYTES = 40         # push_constants.PUSH_BYTES


def load_vulkan():
    """The `vulkan` module, or VulkanUnavailable when the package or the loader library is missing."""
    try:
        import vulkan as vk  # the cffi binding opens libvulkan.so.1 at import
    except (ImportError, OSError) as e:
        raise VulkanUnavailable(
            f"no Vulkan loader: {e}. Install the loader and a driver (Debian/Ubuntu: "
            "apt install libvulkan1 mesa-vulkan-drivers), or run with --backend cpu"
        ) from None
    return vk


@dataclass(frozen=True)
class DeviceInfo:
    """What `gemma-batch devices` prints and what the backend needs to choose its kernels."""

    index: int
    name: str
    type: str
    type_code: int
    api_version: str
    driver: str
    heaps: tuple[tuple[int, bool], ...]  # (bytes, device-local) per memory heap
    fp16: bool
    int8: bool
    bf16: bool
    storage16: bool
    subgroup_size: int
    cooperative_matrix: bool  # the extension is listed
    max_storage_buffer_range: int
    max_shared_memory: int
    max_push_constants: int
    max_workgroup_invocations: int = 0
    max_storage_buffers: int = 0  # per shader stage
    subgroup_ops: bool = False  # subgroup arithmetic and shuffles in compute shaders
    timestamp_period: float = 1.0  # nanoseconds per timestamp tick
    coopmat_fp16: bool = False  # runs shaders/matmul_coop.comp (coopmat.supported)
    extensions: frozenset[str] = field(repr=False, default=frozenset())
    vendor_id: int = 0  # PCI vendor (0x10DE NVIDIA, 0x1002 AMD, ...)
    sm_count: int = 0  # streaming multiprocessors, where the driver says (VK_NV_shader_sm_builtins); 0: unknown

    @property
    def device_local_bytes(self) -> int:
        return max((size for size, local in self.heaps if local), default=0)

    def shortfalls(self) -> list[str]:
        """What this device lacks that the shaders need (empty when it can run them)."""
        checks = [
            (self.storage16, "16-bit storage buffers"),
            (self.subgroup_ops, "subgroup arithmetic and shuffles in compute shaders"),
            (self.subgroup_size >= 8, f"subgroups of at least 8 invocations (has {self.subgroup_size})"),
            (self.max_workgroup_invocations >= NEEDS_WORKGROUP,
             f"workgroups of {NEEDS_WORKGROUP} invocations (has {self.max_workgroup_invocations})"),
            (self.max_shared_memory >= NEEDS_SHARED,
             f"{NEEDS_SHARED // 1024} KiB of shared memory (has {self.max_shared_memory // 1024})"),
            (self.max_storage_buffers >= NEEDS_STORAGE_BUFFERS,
             f"{NEEDS_STORAGE_BUFFERS} storage buffers per shader (has {self.max_storage_buffers})"),
            (self.max_push_constants >= NEEDS_PUSH_BYTES,
             f"{NEEDS_PUSH_BYTES} bytes of push constants (has {self.max_push_constants})"),
        ]
        return [need for ok, need in checks if not ok]

    def describe(self) -> str:
        heaps = ", ".join(f"{size / 2**30:.1f} GiB{' device-local' if local else ''}" for size, local in self.heaps)
        flags = [f"fp16 {'yes' if self.fp16 else 'no'}", f"int8 {'yes' if self.int8 else 'no'}",
                 f"bf16 {'yes' if self.bf16 else 'no'}", f"subgroup {self.subgroup_size}",
                 f"cooperative matrix {'fp16 tiles (used)' if self.coopmat_fp16 else 'yes' if self.cooperative_matrix else 'no'}"]
        return (f"[{self.index}] {self.name} ({self.type}); driver {self.driver}, Vulkan {self.api_version}\n"
                f"    memory heaps: {heaps}\n    {', '.join(flags)}; "
                f"max buffer {self.max_storage_buffer_range / 2**20:.0f} MiB, shared memory {self.max_shared_memory // 1024} KiB"
                + (f"\n    cannot run gemma-batch: lacks {'; '.join(self.shortfalls())}" if self.shortfalls() else ""))


def _version(vk, v: int) -> str:
    return f"{vk.VK_VERSION_MAJOR(v)}.{vk.VK_VERSION_MINOR(v)}.{vk.VK_VERSION_PATCH(v)}"


def create_instance(vk):
    app = vk.VkApplicationInfo(
        sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="gemma-batch", applicationVersion=1,
        pEngineName="gemma-batch", engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 2, 0),
    )
    try:
        return vk.vkCreateInstance(vk.VkInstanceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app), None)
    except vk.VkError as e:
        raise VulkanUnavailable(f"cannot create a Vulkan instance ({type(e).__name__}): no usable driver; "
                                "install one (e.g. mesa-vulkan-drivers) or run with --backend cpu") from None


def describe_device(vk, instance, index: int, pd) -> DeviceInfo:
    props = vk.vkGetPhysicalDeviceProperties(pd)
    exts = frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None))
    sms = (vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV)
           if "VK_NV_shader_sm_builtins" in exts else None)
    sub = vk.VkPhysicalDeviceSubgroupProperties(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                                pNext=sms if sms is not None else vk.ffi.NULL)
    driver = vk.VkPhysicalDeviceDriverProperties(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, pNext=sub)
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=driver))
    f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES)
    s16 = vk.VkPhysicalDevice16BitStorageFeatures(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, pNext=f16)
    vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=s16))
    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    heaps = tuple(
        (int(mem.memoryHeaps[h].size), bool(mem.memoryHeaps[h].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT))
        for h in range(mem.memoryHeapCount)
    )
    driver_name = vk.ffi.string(driver.driverName).decode(errors="replace") if driver.driverName else ""
    driver_info = vk.ffi.string(driver.driverInfo).decode(errors="replace") if driver.driverInfo else ""
    return DeviceInfo(
        index=index,
        name=props.deviceName,
        type=_TYPE_NAMES.get(props.deviceType, "other"),
        type_code=int(props.deviceType),
        api_version=_version(vk, props.apiVersion),
        driver=" ".join(p for p in (driver_name, driver_info) if p) or str(props.driverVersion),
        heaps=heaps,
        fp16=bool(f16.shaderFloat16),
        int8=bool(f16.shaderInt8),
        bf16="VK_KHR_shader_bfloat16" in exts,
        storage16=bool(s16.storageBuffer16BitAccess),
        subgroup_size=int(sub.subgroupSize),
        cooperative_matrix="VK_KHR_cooperative_matrix" in exts,
        max_storage_buffer_range=int(props.limits.maxStorageBufferRange),
        max_shared_memory=int(props.limits.maxComputeSharedMemorySize),
        max_push_constants=int(props.limits.maxPushConstantsSize),
        max_workgroup_invocations=int(props.limits.maxComputeWorkGroupInvocations),
        timestamp_period=float(props.limits.timestampPeriod),
        coopmat_fp16=coopmat.supported(vk, instance, pd, exts, int(sub.subgroupSize)),
        max_storage_buffers=int(props.limits.maxPerStageDescriptorStorageBuffers),
        subgroup_ops=bool(sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
                          and sub.supportedOperations & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT
                          and sub.supportedOperations & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT),
        extensions=exts,
        vendor_id=int(props.vendorID),
        sm_count=int(sms.shaderSMCount) if sms is not None else 0,
    )


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan device the loader reports (raises VulkanUnavailable without a loader or driver)."""
    vk = load_vulkan()
    instance = create_instance(vk)
    try:
        return [describe_device(vk, instance, i, pd) for i, pd in enumerate(vk.vkEnumeratePhysicalDevices(instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def choose_device(devices: list[DeviceInfo], wanted: str | None) -> DeviceInfo:
    """The device `wanted` names (index or a piece of its name), else the preferred kind."""
    if not devices:
        raise VulkanUnavailable("the Vulkan loader found no device; install a driver or run with --backend cpu")
    if wanted:
        if wanted.isdigit():
            if int(wanted) < len(devices):
                return devices[int(wanted)]
        else:
            named = [d for d in devices if wanted.lower() in d.name.lower()]
            if named:
                return named[0]
        names = "; ".join(f"[{d.index}] {d.name}" for d in devices)
        raise VulkanUnavailable(f"no Vulkan device matches {wanted!r}; devices: {names}")
    return min(devices, key=lambda d: (_PREFERENCE.get(d.type_code, 9), d.index))


def usable_gpus(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """The GPUs among `devices` that can run the shaders (no CPU implementation), preferred first."""
    return sorted((d for d in devices if d.type_code != 4 and not d.shortfalls()),
                  key=lambda d: (_PREFERENCE.get(d.type_code, 9), d.index))


class Device:
    """The chosen physical device, a logical device with one compute queue, a command pool, a fence."""

    def __init__(self, wanted: str | None = None, capture_statistics: bool = False) -> None:
        """`capture_statistics`: keep every pipeline's driver statistics, where the driver can
        (pipeline_stats.py; diagnostics only)."""
        vk = self.vk = load_vulkan()
        self.instance = create_instance(vk)
        physical = vk.vkEnumeratePhysicalDevices(self.instance)
        infos = [describe_device(vk, self.instance, i, pd) for i, pd in enumerate(physical)]
        self.info = choose_device(infos, wanted if wanted is not None else os.environ.get(DEVICE_ENV))
        self.physical = physical[self.info.index]
        if self.info.shortfalls():
            self.close()
            raise VulkanUnavailable(f"{self.info.name} cannot run the shaders: it lacks {'; '.join(self.info.shortfalls())}; "
                                    "use another --device or --backend cpu")
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        self.queue_family = next(i for i, q in enumerate(families) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, shaderFloat16=vk.VK_FALSE)
        s16 = vk.VkPhysicalDevice16BitStorageFeatures(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, pNext=f16, storageBuffer16BitAccess=vk.VK_TRUE)
        queue_info = vk.VkDeviceQueueCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, queueFamilyIndex=self.queue_family, queueCount=1,
            pQueuePriorities=[1.0])
        extensions = [e for e in ("VK_EXT_memory_budget",) if e in self.info.extensions]
        self.memory_budget_ext = bool(extensions)
        self.coopmat = self.info.coopmat_fp16 and coopmat.wanted()  # matmuls on matmul_coop.comp
        features, keep = s16, []  # every struct of the feature chain stays alive until the device exists
        if self.coopmat:
            features, model = coopmat.enable_chain(vk, s16, f16)
            keep.append(model)
            extensions.append(coopmat.EXTENSION)
        self.statistics = capture_statistics and pipeline_stats.EXTENSION in self.info.extensions
        if self.statistics:
            keep.append(features)
            features = pipeline_stats.enable_chain(vk, features)
            extensions.append(pipeline_stats.EXTENSION)
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=features, queueCreateInfoCount=1,
            pQueueCreateInfos=[queue_info], enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions), None)
        del keep
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.command_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=self.queue_family,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self.fences: dict[int, object] = {}  # a fence per step in flight, and SYNC_FENCE; made on first use
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)

    def command_buffer(self):
        vk = self.vk
        return vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.command_pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]

    def submit(self, command_buffer, fence: int = 0) -> None:
        """Start `command_buffer` on the queue; `wait(fence)` returns when it is done. Each fence
        (an index of a step in flight, or SYNC_FENCE) has one submission at a time; the queue runs
        them in order."""
        vk = self.vk
        if fence not in self.fences:
            self.fences[fence] = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(
            sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, commandBufferCount=1, pCommandBuffers=[command_buffer])],
            self.fences[fence])

    def wait(self, fence: int = 0) -> None:
        vk = self.vk
        vk.vkWaitForFences(self.device, 1, [self.fences[fence]], vk.VK_TRUE, 2**63 - 1)
        vk.vkResetFences(self.device, 1, [self.fences[fence]])

    def submit_and_wait(self, command_buffer) -> None:
        self.submit(command_buffer, SYNC_FENCE)
        self.wait(SYNC_FENCE)

    def heap_budget(self) -> tuple[int, int] | None:
        """(budget, usage) of the largest device-local heap from VK_EXT_memory_budget, if present."""
        if not self.memory_budget_ext:
            return None
        vk = self.vk
        budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT(sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT)
        vk.vkGetPhysicalDeviceMemoryProperties2(self.physical, vk.VkPhysicalDeviceMemoryProperties2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, pNext=budget))
        heaps = [(h, size) for h, (size, local) in enumerate(self.info.heaps) if local]
        if not heaps:
            return None
        h = max(heaps, key=lambda x: x[1])[0]
        return int(budget.heapBudget[h]), int(budget.heapUsage[h])

    def close(self) -> None:
        vk = self.vk
        if getattr(self, "device", None) is not None:
            vk.vkDeviceWaitIdle(self.device)
            for fence in self.fences.values():
                vk.vkDestroyFence(self.device, fence, None)
            vk.vkDestroyCommandPool(self.device, self.command_pool, None)
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if getattr(self, "instance", None) is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None
