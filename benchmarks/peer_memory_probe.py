"""Which Vulkan devices here could hand activations to each other without a host copy: the
external-memory and device-group extensions each device reports, and the device groups (an
experiment for issue 52; run from the repository root with PYTHONPATH=.)."""

from gemma_batch.backends.vulkan.device import load_vulkan, create_instance
vk = load_vulkan()
inst = create_instance(vk)
pds = vk.vkEnumeratePhysicalDevices(inst)
wanted = ["VK_KHR_external_memory_fd", "VK_EXT_external_memory_dma_buf", "VK_EXT_external_memory_host",
          "VK_KHR_device_group", "VK_KHR_external_semaphore_fd", "VK_NV_external_memory_rdma", "VK_KHR_timeline_semaphore"]
for i, pd in enumerate(pds):
    props = vk.vkGetPhysicalDeviceProperties(pd)
    exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
    print(i, props.deviceName, "uuid-ish", props.deviceID, {w: (w in exts) for w in wanted})
try:
    groups = vk.vkEnumeratePhysicalDeviceGroups(inst)
    for g in groups:
        print("group of", g.physicalDeviceCount, "devices; subsetAllocation", g.subsetAllocation)
except Exception as e:
    print("device groups:", type(e).__name__, e)
