from gemma_batch.backends.vulkan.device import Device
import vulkan as vk
d = Device()
mp = vk.vkGetPhysicalDeviceMemoryProperties(d.physical)
for i in range(mp.memoryTypeCount):
    t = mp.memoryTypes[i]
    f = t.propertyFlags
    names = [n for n in ("DEVICE_LOCAL", "HOST_VISIBLE", "HOST_COHERENT", "HOST_CACHED") if f & getattr(vk, f"VK_MEMORY_PROPERTY_{n}_BIT")]
    print(i, "heap", t.heapIndex, names, mp.memoryHeaps[t.heapIndex].size / 2**30, "GiB")
