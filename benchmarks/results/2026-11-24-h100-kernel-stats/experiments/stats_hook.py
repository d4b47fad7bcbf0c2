"""Register / shared-memory statistics of every pipeline (VK_KHR_pipeline_executable_properties)."""
import sys
import vulkan as vk
from gemma_batch.backends.vulkan import device as devmod, kernels as kmod

EXT = "VK_KHR_pipeline_executable_properties"
_create_device = vk.vkCreateDevice
def create_device(physical, info, alloc):
    feat = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        pNext=info.pNext, pipelineExecutableInfo=vk.VK_TRUE)
    names = [vk.ffi.string(info.ppEnabledExtensionNames[i]).decode() for i in range(info.enabledExtensionCount)] + [EXT]
    new = vk.VkDeviceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=feat, queueCreateInfoCount=1,
                                pQueueCreateInfos=[info.pQueueCreateInfos[0]], enabledExtensionCount=len(names),
                                ppEnabledExtensionNames=names)
    return _create_device(physical, new, alloc)
vk.vkCreateDevice = create_device
_create_pipes = vk.vkCreateComputePipelines
def create_pipes(device, cache, n, infos, alloc):
    infos[0].flags |= vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR | vk.VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR
    return _create_pipes(device, cache, n, infos, alloc)
vk.vkCreateComputePipelines = create_pipes


def stats(kern, name):
    """'regs R, shared S' of pipeline `name` (built now if needed)."""
    dev = kern.dev
    pipe = kern.pipeline(name)
    props_fn = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutablePropertiesKHR")
    stats_fn = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutableStatisticsKHR")
    list(props_fn(dev.device, vk.VkPipelineInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, pipeline=pipe)))
    einfo = vk.VkPipelineExecutableInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, pipeline=pipe, executableIndex=0)
    out = {}
    for s in list(stats_fn(dev.device, einfo)):
        name_ = s.name if isinstance(s.name, str) else vk.ffi.string(s.name).decode()
        out[name_] = {0: s.value.b32, 1: s.value.i64, 2: s.value.u64, 3: s.value.f64}.get(s.format)
    return f"regs {out.get('Register Count')}, shared {out.get('Shared Memory Size')}"


def internal(kern, name):
    """The driver's internal representations of pipeline `name` (name, text), if it gives any."""
    dev = kern.dev
    pipe = kern.pipeline(name)
    fn = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutableInternalRepresentationsKHR")
    einfo = vk.VkPipelineExecutableInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, pipeline=pipe, executableIndex=0)
    reps = list(fn(dev.device, einfo))
    out = []
    for r in reps:
        nm = r.name if isinstance(r.name, str) else vk.ffi.string(r.name).decode()
        out.append((nm, r.isText, r.dataSize))
    return out
